"""configs/vt_math.py:tiny end to end on real GSM8K / SVAMP / MAWPS slices: the task data
is written, the SFT warm start runs on the GSM8K demonstrations, two RL steps run through
the sandboxed python tool with the JAX sampler, and the held-out sets are scored. Slow:
a full trainer run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verltool_jax.cli import parse_command_line

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / ".." / "shared" / "data"

pytestmark = pytest.mark.slow


def test_vt_math_tiny_trains_and_evaluates(tmp_path):
    if not (DATA / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("real data not present beside the repo (../shared/data)")
    from verltool_jax.train.trainer import train

    argv = [
        "--config",
        str(REPO / "configs/vt_math.py") + ":tiny",
        f"--config.task.data_dir={DATA}",
        f"--config.trainer.out_dir={tmp_path / 'run'}",
        "--config.sampler.backend=jax",
        "--config.logging.progress_bar=false",
        "--config.trainer.eval_every=2",
    ]
    summary = train(parse_command_line(argv).config, echo=False).summary
    assert {f.name for f in (tmp_path / "run" / "data").glob("eval_*.parquet")} == {
        "eval_gsm8k.parquet",
        "eval_svamp.parquet",
        "eval_mawps.parquet",
    }
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    sft = [x for x in lines if "sft/sft_loss" in x]
    steps = [x for x in lines if "train/loss" in x]
    evals = [x for x in lines if "eval/acc" in x]
    assert len(sft) == 2 and all(x["sft/sft_tokens"] > 0 for x in sft)
    assert [x["step"] for x in steps] == [1, 2] and all(x["rollout/num"] == 4 for x in steps)
    assert [x["eval/num"] for x in evals] == [8, 8]  # data.max_eval_examples of 3 x 4 rows
    assert summary and (tmp_path / "run" / "trajectories.html").is_file()
