"""``plot_metrics(jsonl, png)``: reward and accuracy over steps, from the metrics file."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from verltool_jax.reporting import names
from verltool_jax.reporting.metrics_writer import read_metrics


def series(records: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` over the records that have a number for it."""
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def plot_metrics(jsonl_path: str | os.PathLike, png_path: str | os.PathLike,
                 title: str = "") -> Path:
    """Write a PNG with two panels: mean reward, and train / eval accuracy, per step.

    Raises ValueError if the file has no reward or accuracy values to plot.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(jsonl_path)
    panels = [("reward", [(names.REWARD, "train reward")]),
              ("accuracy", [(names.ACC, "train acc"), (names.EVAL_ACC, "held-out acc")])]
    if not any(series(records, k)[0] for _, keys in panels for k, _ in keys):
        raise ValueError(f"{jsonl_path}: no {names.REWARD!r}, {names.ACC!r} or "
                         f"{names.EVAL_ACC!r} values to plot")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (ylabel, keys) in zip(axes, panels):
        for key, label in keys:
            xs, ys = series(records, key)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        if ylabel == "accuracy":
            ax.set_ylim(-0.02, 1.02)
    fig.suptitle(title or Path(jsonl_path).parent.name)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
