"""experiments/search_smollm2.py: the data check and the index it builds once (fast), and
the whole staged run with configs/vt_search.py:tiny on the real QA files (slow): base,
SFT on search demonstrations and GRPO with the search tool, tables, resumption."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from support.experiment_scripts import load_experiment

REPO = Path(__file__).resolve().parents[2]
QA = REPO / ".." / "shared" / "data" / "qa"


def _need_data():
    if not (QA / "nq_open_dev.jsonl").is_file():
        pytest.skip("real data not present beside the repo (../shared/data)")


def test_data_check_and_index_built_once(tmp_path, capsys):
    _need_data()
    script = load_experiment("search_smollm2")
    with pytest.raises(SystemExit):  # a folder without the upstream files
        script.main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    assert "missing 2wikimultihopqa_corpus.json" in capsys.readouterr().err
    over = dict(script.data_overrides(str(QA.resolve()), tmp_path, False))
    assert "answer_recall" in capsys.readouterr().out  # the recall table
    answerable = json.loads(Path(over["task.answerable_ids"]).read_text())["ids"]
    assert 700 < len(answerable) < 900  # 811 with this corpus and BM25 top 10
    stamp = (tmp_path / "qa_index" / "meta.json").stat().st_mtime_ns
    script.data_overrides(str(QA.resolve()), tmp_path, False)  # reused, not rebuilt
    assert (tmp_path / "qa_index" / "meta.json").stat().st_mtime_ns == stamp
    # the smol config takes them (the corpus fingerprint matches the index)
    from sft_grpo_stages import stage_config

    c = stage_config(script.RECIPE, "smol", list(over.items()), tmp_path / "run", [], smoke=False)
    assert c.task.num_demos > 0 and c.sft.steps > 0 and c.model.lora_rank > 0


@pytest.mark.slow
def test_search_smollm2_smoke_runs_and_resumes(tmp_path, capfd):
    _need_data()
    script = load_experiment("search_smollm2")
    out = tmp_path / "exp"
    argv = [
        "--smoke",
        "--data-dir",
        str(QA),
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
    text = capfd.readouterr().out
    for stage in ("base", "sft seed 1", "grpo seed 1"):
        assert f"[search_smollm2] {stage}: wall time" in text
    assert "[sft] step 1/1" in text
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {r["stage"] for r in rows} == {"base", "sft", "grpo"}
    for r in rows:  # EM as acc, plus the retrieval metrics of the set
        assert r["set"] in ("nq", "hotpotqa") and 0.0 <= float(r["acc"]) <= 1.0
        assert float(r["em"]) == float(r["acc"]) and "searches" in r and "f1" in r
    assert "Greedy exact match" in (out / "results.md").read_text()
    assert (out / "accuracy.png").stat().st_size > 1000
    exp = json.loads((out / "experiment.json").read_text())
    assert exp["experiment"] == "search_smollm2"
    assert exp["config"]["task"]["name"] == "search_qa"
    assert script.main(argv) == 0  # resumed: every stage is skipped
    assert capfd.readouterr().out.count("done before") == 3
