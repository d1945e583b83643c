"""Plots from metrics files: ``plot_metrics(jsonl, png)`` (one run: reward and accuracy per
step) and ``plot_sweep(runs, png)`` (a sweep: held-out accuracy and reward per arm)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from verltool_jax import metric_names as names
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


def plot_metrics(
    jsonl_path: str | os.PathLike, png_path: str | os.PathLike, title: str = ""
) -> Path:
    """Write a PNG of one run per step: mean reward; train / held-out accuracy; the
    learning signal (the fraction of groups with equal rewards, i.e. no gradient, and the
    fractions of groups that failed / solved every sample); and, with a curriculum, each
    dataset's difficulty level.

    Raises ValueError if the file has no reward or accuracy values to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(jsonl_path)
    panels = [
        ("reward", [(names.REWARD, "train reward")]),
        ("accuracy", [(names.ACC, "train acc"), (names.EVAL_ACC, "held-out acc")]),
    ]
    if not any(series(records, k)[0] for _, keys in panels for k, _ in keys):
        raise ValueError(
            f"{jsonl_path}: no {names.REWARD!r}, {names.ACC!r} or {names.EVAL_ACC!r} values to plot"
        )
    signal = [
        (names.NO_SIGNAL_FRAC, "no signal (equal rewards)"),
        (names.PASS_RATE_0, "all failed"),
        (names.PASS_RATE_100, "all solved"),
    ]
    if series(records, names.NO_SIGNAL_FRAC)[0]:
        panels.append(("fraction of groups", signal))
    levels = sorted(
        {k for r in records for k in r if k.startswith("curriculum/") and k.endswith("/level")}
    )
    if levels:
        panels.append(("difficulty level", [(k, k.split("/")[1]) for k in levels]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (ylabel, keys) in zip(axes, panels):
        for key, label in keys:
            xs, ys = series(records, key)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        if ylabel in ("accuracy", "fraction of groups"):
            ax.set_ylim(-0.02, 1.02)
    fig.suptitle(title or Path(jsonl_path).parent.name)
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


def trailing_mean(ys: Sequence[float], window: int) -> list[float]:
    """Trailing moving average: ``out[i] = mean(ys[max(0, i - window + 1) : i + 1])``
    (the first points average what there is so far). ``window`` >= 1."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def seed_mean_curve(
    curves: Sequence[tuple[Sequence[int], Sequence[float], Sequence[float]]],
) -> tuple[list[int], list[float], list[float]]:
    """An arm's curve over its seeds: at each step every seed logged, the mean value and
    the mean wall time. ``curves``: ``(steps, seconds, values)`` per seed; steps a seed
    lacks are left out (a run that stopped early shortens the mean curve)."""
    curves = [c for c in curves if c[0]]
    if not curves:
        return [], [], []
    common = set(curves[0][0]).intersection(*(set(c[0]) for c in curves[1:]))
    steps = sorted(common)
    per_seed = [{st: (sec, y) for st, sec, y in zip(*c)} for c in curves]
    secs = [sum(d[st][0] for d in per_seed) / len(per_seed) for st in steps]
    ys = [sum(d[st][1] for d in per_seed) / len(per_seed) for st in steps]
    return steps, secs, ys


def _draw_curve(ax, curve, col: int, smooth: int, **kw) -> bool:
    """Plot ``curve`` = ``(steps, seconds, values)`` against steps (``col`` 0) or seconds;
    30 points or more as a ``smooth``-step trailing mean. True if it was smoothed."""
    steps, secs, ys = curve
    if not ys:
        return False
    smoothed = len(ys) >= 30 and smooth > 1
    if smoothed:
        ys = trailing_mean(ys, smooth)
    ax.plot(
        steps if col == 0 else secs, ys, marker="o" if len(ys) < 30 else None, markersize=3, **kw
    )
    return smoothed


def plot_sweep(
    runs: Mapping[str, Sequence], png_path: str | os.PathLike, title: str = "", smooth: int = 5
) -> Path:
    """One PNG for a sweep: held-out accuracy and train reward against step and against
    wall time (seconds since each run's first logged record), one colour per arm: a bold
    line for the mean over the arm's seeds (at the steps all of them logged; wall time is
    the seeds' mean), each seed a faint line of the same colour. Curves of 30 points or
    more (the per-step train reward) are drawn as a ``smooth``-step trailing mean
    (:func:`trailing_mean`), and the panel says so.

    ``runs``: ``{arm: [RunRecord, ...]}`` (:mod:`verltool_jax.reporting.run_dirs`).
    Raises ValueError if no run has a reward or held-out accuracy curve.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ((names.EVAL_ACC, "held-out accuracy"), (names.REWARD, "train reward"))
    if not any(
        rec.curves.get(k, ([],))[0] for recs in runs.values() for rec in recs for k, _ in keys
    ):
        raise ValueError(
            f"no run of the sweep has {names.REWARD!r} or {names.EVAL_ACC!r} values to plot"
        )
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, (key, ylabel) in enumerate(keys):
        smoothed = False
        for col, xlabel in enumerate(("step", "wall time (s)")):
            ax = axes[row][col]
            for i, (arm, recs) in enumerate(runs.items()):
                colour = colours[i % len(colours)]
                curves = [rec.curves.get(key, ([], [], [])) for rec in recs]
                for c in curves if len(recs) > 1 else ():
                    smoothed |= _draw_curve(
                        ax, c, col, smooth, color=colour, alpha=0.25, linewidth=0.8
                    )
                n = sum(1 for c in curves if c[0])
                smoothed |= _draw_curve(
                    ax,
                    seed_mean_curve(curves),
                    col,
                    smooth,
                    color=colour,
                    linewidth=2.0,
                    label=f"{arm} (mean of {n} seeds)" if n > 1 else arm,
                )
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel + (f" ({smooth}-step trailing mean)" if smoothed else ""))
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle(title or "sweep")
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
