"""experiments/sql_smollm2.py: the data check (fast) and the whole staged run with
configs/vt_sql.py:tiny on the real Spider files (slow): base, SFT on SQL demonstrations
and GRPO with the sql tool, the table with execution accuracy, resumption."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from support.experiment_scripts import load_experiment

REPO = Path(__file__).resolve().parents[2]
SPIDER = REPO / ".." / "shared" / "data" / "spider"


def test_data_check_names_what_is_missing(tmp_path, capsys):
    script = load_experiment("sql_smollm2")
    with pytest.raises(SystemExit):
        script.main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "missing train_queries.csv, test_queries.csv, databases" in err


def test_result_rows_carry_the_sql_metrics_by_hardness():
    stages = load_experiment("sft_grpo_stages")
    res = {
        "wall_s": 12.0,
        "eval": {
            "modes": {
                "greedy": {"spider": {"acc": 0.25, "problems": 4}},
                "T=1,n=2": {"spider": {"acc": 0.125, "problems": 4}},
            },
            "sql": {
                "sql/exec_acc": 0.25,
                "sql/exec_acc/easy": 0.5,
                "sql/count/easy": 2.0,
                "sql/calls_per_question": 1.5,
            },
        },
    }
    greedy, sampled = stages.rows_of("sft", 1, res)
    assert greedy["mode"] == "greedy" and greedy["acc"] == 0.25
    assert (
        greedy["sql_exec_acc_easy"],
        greedy["sql_count_easy"],
        greedy["sql_calls_per_question"],
    ) == (0.5, 2.0, 1.5)
    assert not any(k.startswith("sql_") for k in sampled)  # greedy metrics only


@pytest.mark.slow
def test_sql_smollm2_smoke_runs_and_resumes(tmp_path, capsys):
    if not (SPIDER / "test_queries.csv").is_file():
        pytest.skip("real data not present beside the repo (../shared/data)")
    script = load_experiment("sql_smollm2")
    out = tmp_path / "exp"
    argv = [
        "--smoke",
        "--data-dir",
        str(SPIDER),
        "--out",
        str(out),
        "--seeds",
        "1",
        "--set",
        "data.max_eval_examples=2",
        "--set",
        "rollout.max_response_tokens=16",
        "--set",
        "trainer.steps=1",
    ]
    assert script.main(argv) == 0
    text = capsys.readouterr().out
    for stage in ("base", "sft seed 1", "grpo seed 1"):
        assert f"[sql_smollm2] {stage}: wall time" in text
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {(r["stage"], r["set"]) for r in rows} == {
        (s, "spider") for s in ("base", "sft", "grpo")
    }
    assert all(r["problems"] == "2" and 0.0 <= float(r["acc"]) <= 1.0 for r in rows)
    assert "Greedy execution accuracy" in (out / "results.md").read_text()
    exp = json.loads((out / "experiment.json").read_text())
    assert exp["experiment"] == "sql_smollm2" and exp["config"]["task"]["name"] == "spider"
    assert all("sql_exec_acc" in r and "sql_calls_per_question" in r for r in rows)
    for report in (
        "base/trajectories.html",
        "sft_seed1/eval/trajectories.html",
        "grpo_seed1/eval/trajectories.html",
    ):  # every evaluation's turns
        assert "eval: " in (out / report).read_text()
    assert script.main(argv) == 0
    assert capsys.readouterr().out.count("done before") == 3
