"""What a finished run directory says: ``summary.json`` + ``metrics.jsonl`` -> one record.

A run directory is what ``python -m verltool_jax.train`` writes into ``trainer.out_dir``:
``summary.json`` (``eval_before``, ``eval_after``, ``steps``, ``interrupted``,
``wall_s``), ``metrics.jsonl`` (one JSON object per logged step, names in
:mod:`verltool_jax.metric_names`; SFT records carry only ``sft/*`` keys) and
``config.json``. :func:`read_run` turns that into a :class:`RunRecord`, the unit the
sweep tables and the reproduction table are built from.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from verltool_jax import metric_names as names
from verltool_jax.reporting.metrics_writer import read_metrics

DROPPED = names.QUEUE_DROPPED_STALE
STALENESS = names.STALENESS

# The per-run scalars the sweep table reports, in column order: (key, header).
RUN_SCALARS = (
    ("eval_before", "held-out acc before"),
    ("eval_after", "held-out acc after"),
    ("reward", "train reward (last half)"),
    ("tokens_per_s", "tokens/s"),
    ("dropped_groups", "dropped groups"),
    ("staleness", "mean staleness"),
    ("wall_s", "wall (s)"),
)


@dataclass
class RunRecord:
    """One finished (or interrupted) run.

    * ``eval_before`` / ``eval_after``: held-out accuracy at the start of RL and at the
      end (``summary.json``; None when the run has no eval set or was interrupted);
    * ``reward``: mean of ``reward/mean`` over the last half of the RL steps (at least one);
    * ``tokens_per_s``: mean of ``perf/tokens_per_s`` over the RL steps;
    * ``dropped_groups``: the last ``queue/dropped_stale`` (a cumulative counter; 0 when
      the run never dropped one or ran synchronously);
    * ``staleness``: mean of ``rollout/staleness_mean`` over the RL steps;
    * ``wall_s``: the run's wall time (``summary.json``);
    * ``curves``: per metric, ``(steps, seconds since the run's first record, values)``
      for ``reward/mean`` and ``eval/acc``.
    """

    path: Path
    eval_before: float | None = None
    eval_after: float | None = None
    reward: float | None = None
    tokens_per_s: float | None = None
    dropped_groups: float | None = None
    staleness: float | None = None
    wall_s: float | None = None
    steps: int = 0
    interrupted: bool = False
    config: dict = field(default_factory=dict)
    curves: dict = field(default_factory=dict)

    def value(self, key: str) -> float | None:
        return getattr(self, key)


def is_finished(run_dir: str | os.PathLike) -> bool:
    """True when ``run_dir/summary.json`` exists and says the run was not interrupted."""
    p = Path(run_dir) / "summary.json"
    if not p.is_file():
        return False
    try:
        return not json.loads(p.read_text()).get("interrupted", False)
    except (OSError, ValueError):
        return False


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def read_run(run_dir: str | os.PathLike) -> RunRecord:
    """The :class:`RunRecord` of ``run_dir``. FileNotFoundError names the missing file."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(
            f"{summary_path}: no summary.json (the run has not finished; "
            f"run it, or resume it with the same command)"
        )
    s = json.loads(summary_path.read_text())
    rec = RunRecord(
        path=run_dir,
        eval_before=_num(s.get("eval_before")),
        eval_after=_num(s.get("eval_after")),
        wall_s=_num(s.get("wall_s")),
        steps=int(s.get("steps", 0)),
        interrupted=bool(s.get("interrupted")),
    )
    cfg = run_dir / "config.json"
    if cfg.is_file():
        try:
            rec.config = json.loads(cfg.read_text())
        except ValueError:
            rec.config = {}
    jsonl = run_dir / "metrics.jsonl"
    records = read_metrics(jsonl) if jsonl.is_file() else []
    # the default is never read: with no timed record the curves below are empty
    t0 = min((r["time"] for r in records if _num(r.get("time")) is not None), default=0.0)
    rl = [r for r in records if _num(r.get(names.REWARD)) is not None]
    rewards = [float(r[names.REWARD]) for r in rl]
    if rewards:
        rec.reward = _mean(rewards[len(rewards) // 2 :])
    rec.tokens_per_s = _mean(
        [float(r[names.TOKENS_PER_S]) for r in rl if _num(r.get(names.TOKENS_PER_S)) is not None]
    )
    rec.staleness = _mean([float(r[STALENESS]) for r in rl if _num(r.get(STALENESS)) is not None])
    dropped = [float(r[DROPPED]) for r in rl if _num(r.get(DROPPED)) is not None]
    rec.dropped_groups = dropped[-1] if dropped else (0.0 if rl else None)
    for key in (names.REWARD, names.EVAL_ACC):
        pts = [
            (int(r["step"]), float(r["time"]) - t0, float(r[key]))
            for r in records
            if _num(r.get(key)) is not None and _num(r.get("time")) is not None
        ]
        rec.curves[key] = ([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts])
    return rec
