"""experiments/math_smollm2.py --smoke end to end (configs/vt_math.py:tiny on real GSM8K /
SVAMP / MAWPS slices): base, SFT and GRPO stages for two seeds, the CSV / markdown table /
plot, and resumption (a second run skips every finished stage). Slow: four trainer runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from support.experiment_scripts import load_experiment

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / ".." / "shared" / "data"

pytestmark = pytest.mark.slow


def _script():
    return load_experiment("math_smollm2")


def test_math_smollm2_smoke_runs_and_resumes(tmp_path, capsys):
    if not (DATA / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("real data not present beside the repo (../shared/data)")
    script = _script()
    out = tmp_path / "exp"
    argv = [
        "--smoke",
        "--data-dir",
        str(DATA),
        "--out",
        str(out),
        "--seeds",
        "1,2",
        "--set",
        "data.max_eval_examples=2",
        "--set",
        "rollout.max_response_tokens=16",
        "--set",
        "trainer.steps=1",
        "--set",
        "sft.steps=1",
    ]
    assert script.main(argv) == 0
    text = capsys.readouterr().out
    for stage in ("base", "sft seed 1", "grpo seed 1", "sft seed 2", "grpo seed 2"):
        assert f"[math_smollm2] {stage}: wall time" in text
    rows = list(csv.DictReader((out / "results.csv").open()))
    got = {(r["stage"], r["seed"], r["set"]) for r in rows}
    sets = {"gsm8k", "svamp", "mawps"}
    assert got == (
        {("base", "-", s) for s in sets}
        | {(st, str(sd), s) for st in ("sft", "grpo") for sd in (1, 2) for s in sets}
    )
    assert all(r["problems"] == "2" and 0.0 <= float(r["acc"]) <= 1.0 for r in rows)
    md = (out / "results.md").read_text()
    assert "| base |" in md and "| grpo |" in md and "gsm8k" in md
    assert (out / "accuracy.png").stat().st_size > 1000
    assert (out / "sft_seed1" / "hf_model" / "config.json").is_file()
    assert (out / "grpo_seed2" / "hf_model" / "config.json").is_file()
    exp = json.loads((out / "experiment.json").read_text())  # for experiments/reproduce.py
    assert exp["config"]["task"]["name"] == "vt_math"
    assert "gsm8k (2 problems): base" in exp["summary"] and "grpo" in exp["summary"]

    assert script.main(argv) == 0  # resumed: every stage is skipped
    text = capsys.readouterr().out
    assert text.count("done before") == 5 and "wall time" not in text.split("| stage")[0]
