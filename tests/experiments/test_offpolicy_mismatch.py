"""``experiments/offpolicy_mismatch.py``: the per-arm mismatch table from run directories."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from verltool_jax import metric_names as names

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "offpolicy_mismatch.py"


def _load():
    spec = importlib.util.spec_from_file_location("offpolicy_mismatch", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_means_maxes_and_missing_metrics(tmp_path):
    run = tmp_path / "seq_tis" / "seed0"
    run.mkdir(parents=True)
    rows = [
        {
            f"train/{names.TRAIN_MISMATCH_KL_K3}": 0.01,
            f"train/{names.TRAIN_MISMATCH_RATIO_MAX}": 1.5,
        },
        {
            f"train/{names.TRAIN_MISMATCH_KL_K3}": 0.03,
            f"train/{names.TRAIN_MISMATCH_RATIO_MAX}": 2.5,
        },
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "sampler" / "seed1").mkdir(parents=True)
    (tmp_path / "sampler" / "seed1" / "metrics.jsonl").write_text('{"step": 1}\n')
    out = _load().table(tmp_path).splitlines()
    assert out[2] == "| sampler | seed1 | - | - | - | - |"
    assert out[3] == "| seq_tis | seed0 | 0.02 | - | - | 2.5 |"
    assert _load().main([str(tmp_path / "nope")]) == 2
