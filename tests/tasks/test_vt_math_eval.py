"""``python -m verltool_jax.eval`` on configs/vt_math.py:tiny with the untrained model
(``--checkpoint base``): per-test-set metrics for GSM8K / SVAMP / MAWPS slices, greedy and
sampled (pass@k), the HTML report and the JSON metrics; a ``--data`` source file; and the
flags' error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verltool_jax import eval as eval_cli

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / ".." / "shared" / "data"


def _argv(tmp_path, *extra):
    return [
        "--config",
        str(REPO / "configs/vt_math.py") + ":tiny",
        f"--config.task.data_dir={DATA}",
        f"--config.trainer.out_dir={tmp_path / 'run'}",
        "--config.sampler.backend=jax",
        "--config.logging.progress_bar=false",
        "--config.data.max_eval_examples=2",
        "--config.rollout.max_response_tokens=16",
        *extra,
    ]


@pytest.mark.parametrize(
    "flags,msg",
    [
        (["--samples", "x"], "--samples='x' is not an integer"),
        (["--samples", "-1"], "--samples=-1 must be >= 0"),
        (["--samples", "2", "--temperature", "0"], "--temperature=0.0 must be > 0"),
        (["--samples", "2", "--k", "3"], "--k=3 needs --samples >= k >= 1"),
        (["--limit", "x"], "--limit='x' is not an integer"),
        (["--limit", "-2"], "--limit=-2 must be >= 0"),
    ],
)
def test_eval_flags_are_validated(tmp_path, capsys, flags, msg):
    argv = ["--config", "configs/vt_math.py:tiny", "--checkpoint", "base", *flags]
    assert eval_cli.main(argv) == 2
    assert msg in capsys.readouterr().err


def test_eval_data_flag_errors(tmp_path, capfd):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n")
    assert (
        eval_cli.main(
            ["--config", "configs/vt_math.py:tiny", "--checkpoint", "base", "--data", str(bad)]
        )
        == 2
    )
    assert "is not .parquet, .jsonl or .json" in capfd.readouterr().err
    assert (
        eval_cli.main(
            [
                "--config",
                "configs/vt_math.py:tiny",
                "--checkpoint",
                "base",
                "--data",
                str(tmp_path / "none.jsonl"),
            ]
        )
        == 2
    )
    assert "no such file" in capfd.readouterr().err


def test_eval_base_model_per_test_set(tmp_path, capfd):
    if not (DATA / "gsm8k" / "test.jsonl").is_file():
        pytest.skip("real data not present beside the repo (../shared/data)")
    report, out_json = tmp_path / "eval.html", tmp_path / "eval.json"
    rc = eval_cli.main(
        _argv(
            tmp_path,
            "--checkpoint",
            "base",
            "--samples",
            "2",
            "--report",
            str(report),
            "--json",
            str(out_json),
        )
    )
    assert rc == 0
    out = capfd.readouterr().out
    res = json.loads(out_json.read_text())
    assert res["what"].startswith("base model")
    assert set(res["modes"]) == {"greedy", "T=1,n=2"}
    for mode, k in (("greedy", 1), ("T=1,n=2", 2)):
        sets = res["modes"][mode]
        assert sorted(sets) == ["gsm8k", "mawps", "svamp"]
        for m in sets.values():
            assert m["problems"] == 2 and m["samples"] == 2 * k
            assert 0.0 <= m["acc"] <= m[f"pass@{k}"] <= 1.0
            assert 0.0 <= m["tool_call_rate"] <= 1.0 and m["turns"] >= 1
            assert 0 < m["response_len"] <= 16 * 2 + 24
    assert "greedy     gsm8k" in out and "T=1,n=2    svamp" in out
    assert report.is_file() and "eval: base model" in report.read_text()

    # --data: one source file of the math family replaces the config's test sets
    # (whole, or its first --limit problems).
    rc = eval_cli.main(
        _argv(
            tmp_path,
            "--checkpoint",
            "base",
            "--data",
            str(DATA / "math" / "amc23_test.jsonl"),
            "--limit",
            "2",
            "--json",
            str(out_json),
        )
    )
    assert rc == 0
    sets = json.loads(out_json.read_text())["modes"]["greedy"]
    assert list(sets) == ["amc23"] and sets["amc23"]["problems"] == 2


def test_error_summary_counts_each_message():
    from verltool_jax.eval import error_summary
    from verltool_jax.rollout.trajectory import Trajectory

    def traj(i, termination, error=""):
        t = Trajectory(trajectory_id=f"t{i}", group_id="g", prompt_ids=[1])
        t.termination, t.error = termination, error
        return t

    trajs = [
        traj(0, "eos"),
        traj(1, "error", "SamplerTimeoutError: x"),
        traj(2, "error", "SamplerTimeoutError: x"),
        traj(3, "error", "ToolError: y"),
    ]
    out = error_summary(trajs)
    assert out.splitlines() == ["  2 x SamplerTimeoutError: x", "  1 x ToolError: y"]
    assert error_summary(trajs[:1]) == ""
