"""Metrics to a JSONL file and TensorBoard (tensorboardX); wandb if asked and installed.

Each ``write(step, metrics)`` appends one JSON object ``{"step": s, "time": t, ...}``
to ``<out_dir>/metrics.jsonl`` (non-finite floats become ``null``; arrays of one number
become that number) and adds every numeric metric as a TensorBoard scalar.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verltool_jax.runtime.append_file import open_for_append


def _scalar(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "size", 1) == 1:  # numpy / jax scalars
        v = v.item()
    if isinstance(v, bool):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsWriter:
    """Writes metrics (see the module doc). Use as a context manager or call ``close``."""

    def __init__(
        self,
        out_dir: str | os.PathLike,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "verltool-jax",
        config: Mapping | None = None,
        filename: str = "metrics.jsonl",
    ):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.out_dir / filename
        # a torn last line (a crash or a full disk mid-write) is dropped before appending
        self._f = open_for_append(self.jsonl_path, encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))
        self._wandb = None
        if wandb:
            try:
                import wandb as wandb_mod
            except ImportError:
                raise ImportError(
                    "logging.wandb=True but wandb is not installed; "
                    "pip install wandb or set --config.logging.wandb=false"
                ) from None
            self._wandb = wandb_mod.init(
                project=wandb_project, dir=str(self.out_dir), config=dict(config or {})
            )

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict:
        """Log ``metrics`` at ``step``; returns the JSON record written."""
        record = {"step": int(step), "time": round(time.time(), 3)}
        for k, v in metrics.items():
            record[str(k)] = _scalar(v)
        self._f.write(json.dumps(record, default=str) + "\n")
        self._f.flush()
        numeric = {
            k: v
            for k, v in record.items()
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=int(step))
        return record

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics JSONL file (a torn last line, from a crash, is skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
