"""The command-line flags of a short, quiet tiny_math run (``configs/tiny_math.py:smoke``,
the JAX sampler, no SFT, no plots, no held-out set), shared by the fault tests."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def smoke_train_flags(out: Path, steps: int) -> list[str]:
    """Flags for ``python -m verltool_jax.train`` (or its ``main``): ``steps`` RL steps
    writing to ``out``."""
    return [
        "--config",
        str(REPO / "configs/tiny_math.py") + ":smoke",
        "--config.sampler.backend=jax",
        "--config.sft.steps=0",
        f"--config.trainer.out_dir={out}",
        f"--config.trainer.steps={steps}",
        "--config.logging.progress_bar=false",
        "--config.logging.plot=false",
        "--config.logging.tensorboard=false",
        "--config.data.max_eval_examples=0",
    ]
