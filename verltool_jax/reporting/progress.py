"""The one-line progress display: step, reward, accuracy, tokens/s and the time split.

step 12/100 | reward 0.412 | acc 0.375 | 1.23k tok/s | rollout-wait 3.1s train 1.0s sync 0.2s
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from verltool_jax import metric_names as names


def _si(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{suffix}"
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


def format_progress(
    step: int, total: int | None, metrics: Mapping[str, float], unit: str = "step"
) -> str:
    """The progress line; metrics that are absent are left out. ``unit`` names what
    ``step`` counts (``step``; an evaluation's mode, e.g. ``greedy``, counting problems)."""
    parts = [f"{unit} {step}/{total}" if total else f"{unit} {step}"]
    if metrics.get(names.REWARD) is not None:
        parts.append(f"reward {metrics[names.REWARD]:.3f}")
    if metrics.get(names.ACC) is not None:
        parts.append(f"acc {metrics[names.ACC]:.3f}")
    if metrics.get(names.EVAL_ACC) is not None:
        parts.append(f"eval-acc {metrics[names.EVAL_ACC]:.3f}")
    if metrics.get(names.NO_SIGNAL_FRAC) is not None:
        parts.append(f"no-signal {metrics[names.NO_SIGNAL_FRAC]:.2f}")
    if metrics.get(names.TOKENS_PER_S) is not None:
        parts.append(f"{_si(metrics[names.TOKENS_PER_S])} tok/s")
    timed = [
        (label, metrics.get(key))
        for label, key in (
            ("rollout-wait", names.TIME_ROLLOUT_WAIT),
            ("train", names.TIME_TRAIN),
            ("sync", names.TIME_SYNC),
        )
    ]
    times = [f"{label} {v:.1f}s" for label, v in timed if v is not None]
    if times:
        parts.append(" ".join(times))
    return " | ".join(parts)


class ProgressBar:
    """A tqdm bar over train steps (or what ``unit`` names) whose description is
    :func:`format_progress`."""

    def __init__(
        self, total: int, initial: int = 0, enabled: bool = True, file=None, unit: str = "step"
    ):
        from tqdm import tqdm

        self.total, self.unit = total, unit
        self._bar = tqdm(
            total=total,
            initial=initial,
            desc=format_progress(initial, total, {}, unit),
            disable=not enabled,
            mininterval=0,
            dynamic_ncols=True,
            file=file if file is not None else sys.stderr,
            bar_format="{bar:20} {desc} [{elapsed}<{remaining}]",
        )

    def update(self, step: int, metrics: Mapping[str, float]) -> str:
        """Move to ``step`` (the number of steps done) and show the metrics; returns the line."""
        line = format_progress(step, self.total, metrics, self.unit)
        self._bar.set_description_str(line, refresh=False)
        if step > self._bar.n:
            self._bar.update(step - self._bar.n)
        else:
            self._bar.refresh()
        return line

    def close(self) -> None:
        self._bar.close()
