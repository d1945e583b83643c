"""The chaos soak, short (experiments/chaos_soak.py): 20 RL steps of the main job while a
tool server, a sandbox, a reward worker, the vLLM engine core and the trainer are killed
and the disk fills once; the run finishes with exact data accounting and no orphan."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _soak():
    spec = importlib.util.spec_from_file_location("chaos_soak", REPO / "experiments/chaos_soak.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["chaos_soak"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_plan_is_seeded_one_fault_of_each_kind_at_distinct_steps():
    soak = _soak()
    a, b = soak.plan(200, seed=0), soak.plan(200, seed=0)
    assert [(f.kind, f.step) for f in a] == [(f.kind, f.step) for f in b]
    assert sorted(f.kind for f in a) == sorted(soak.KINDS)
    steps = [f.step for f in a]
    assert len(set(steps)) == len(steps) and min(steps) >= 2 and max(steps) <= 198
    assert [f.step for f in soak.plan(200, seed=1)] != steps
    with pytest.raises(ValueError, match="too few steps"):
        soak.plan(8, seed=0)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the disk fault mounts a tmpfs (root)")
def test_a_short_soak_survives_every_fault(tmp_path):
    soak = _soak()
    report = tmp_path / "soak.json"
    rc = soak.main(
        ["--steps", "20", "--out", str(tmp_path / "run"), "--json", str(report),
         "--", "--config.trainer.eval_every=0"]
    )  # fmt: skip
    r = json.loads(report.read_text())
    assert rc == 0, r["table"]
    assert all(f["survived"] for f in r["faults"]) and len(r["faults"]) == 6
    assert r["summary"]["data"]["ok"] and r["summary"]["steps"] == 20
    assert not any(c["left"] for c in r["orphan_checks"])
    assert [x["exit"] for x in r["restarts"]][-1] == 0 and len(r["restarts"]) >= 3
