"""A sweep's results: per arm, mean and spread over seeds, which differences exceed it.

Input: ``{arm name: [RunRecord per seed]}`` (:mod:`verltool_jax.reporting.run_dirs`),
arms in order, the first one the baseline. Output: one markdown table, one CSV and one
plot (:func:`verltool_jax.reporting.plots.plot_sweep`).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from verltool_jax.reporting.run_dirs import RUN_SCALARS, RunRecord

RUN_SCALAR_KEYS = tuple(k for k, _ in RUN_SCALARS)


@dataclass(frozen=True)
class Stat:
    """Mean and spread of one metric over an arm's seeds (``n`` seeds had a value)."""

    mean: float | None
    spread: float | None
    n: int


def mean_spread(values: Sequence[float | None]) -> Stat:
    """Mean and spread of the non-None ``values``.

    spread = sample standard deviation ``sqrt(sum (x - mean)^2 / (n - 1))`` for n >= 2,
    None for n < 2 (one seed says nothing about the spread).
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return Stat(None, None, 0)
    return Stat(statistics.fmean(xs), statistics.stdev(xs) if len(xs) >= 2 else None, len(xs))


def exceeds_spread(a: Stat, b: Stat) -> bool | None:
    """Whether arms ``a`` and ``b`` differ by more than their seed spread:
    ``|mean_a - mean_b| > spread_a + spread_b``.

    None when either side lacks a mean or a spread (fewer than two seeds). This is a
    screening rule (no significance test): with 2-3 seeds a difference inside the summed
    standard deviations is indistinguishable from seed noise.
    """
    if a.mean is None or b.mean is None or a.spread is None or b.spread is None:
        return None
    return abs(a.mean - b.mean) > a.spread + b.spread


@dataclass
class ArmRow:
    """One table row: the arm's stats per metric and the comparison with the baseline."""

    arm: str
    seeds: int
    stats: dict  # metric key -> Stat
    exceeds: dict  # metric key -> Optional[bool] vs the baseline (None for it)


def arm_rows(
    runs: Mapping[str, Sequence[RunRecord]],
    metrics: Sequence[str] = RUN_SCALAR_KEYS,
) -> list[ArmRow]:
    """One :class:`ArmRow` per arm (in ``runs`` order); the first arm is the baseline."""
    rows = []
    base: dict | None = None
    exceeds: dict[str, bool | None]
    for arm, recs in runs.items():
        stats = {m: mean_spread([r.value(m) for r in recs]) for m in metrics}
        if base is None:
            base = stats
            exceeds = {m: None for m in metrics}
        else:
            exceeds = {m: exceeds_spread(stats[m], base[m]) for m in metrics}
        rows.append(ArmRow(arm, len(recs), stats, exceeds))
    return rows


def _fmt(x: float | None, like: float | None = None) -> str:
    """Three decimals below 10, none from 10 on; ``like``: take the precision from that
    number instead (a spread is printed as precisely as its mean: ``588 ± 8``, not
    ``588 ± 7.877``)."""
    if x is None:
        return "-"
    scale = abs(x if like is None else like)
    return f"{x:.3f}" if scale < 10 else f"{x:.0f}"


def _cell(s: Stat, flag: bool | None) -> str:
    if s.mean is None:
        return "-"
    text = _fmt(s.mean) + (f" ± {_fmt(s.spread, like=s.mean)}" if s.spread is not None else "")
    return f"**{text}**" if flag else text


def markdown_table(rows: Sequence[ArmRow]) -> str:
    """The markdown table: ``mean ± sd`` per metric, bold where the arm differs from the
    baseline (first row) by more than the summed spreads, then one line per such difference."""
    headers = dict(RUN_SCALARS)
    metrics = list(rows[0].stats) if rows else []
    out = [
        "| arm | seeds | " + " | ".join(headers.get(m, m) for m in metrics) + " |",
        "|---|---|" + "---|" * len(metrics),
    ]
    for r in rows:
        out.append(
            f"| {r.arm} | {r.seeds} | "
            + " | ".join(_cell(r.stats[m], r.exceeds[m]) for m in metrics)
            + " |"
        )
    out.append("")
    out.extend(difference_lines(rows))
    return "\n".join(out) + "\n"


def difference_lines(rows: Sequence[ArmRow]) -> list[str]:
    """Plain sentences: which differences from the baseline exceed the seed spread."""
    if not rows:
        return []
    headers = dict(RUN_SCALARS)
    base = rows[0]
    lines = []
    for r in rows[1:]:
        for m, flag in r.exceeds.items():
            if flag:
                lines.append(
                    f"- {r.arm} vs {base.arm}: {headers.get(m, m)} "
                    f"{_fmt(r.stats[m].mean)} vs {_fmt(base.stats[m].mean)} "
                    f"(difference exceeds the summed seed spreads)"
                )
    if len(rows) > 1 and not lines:
        undecided = any(f is None for r in rows[1:] for f in r.exceeds.values())
        lines.append(
            "- no difference from "
            + base.arm
            + " exceeds the seed spread"
            + (" (some metrics have fewer than 2 seeds: not decidable)" if undecided else "")
        )
    return lines


def csv_text(rows: Sequence[ArmRow]) -> str:
    """CSV: arm, seeds, then ``<metric>_mean``, ``<metric>_sd``, ``<metric>_exceeds`` per metric."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    metrics = list(rows[0].stats) if rows else []
    w.writerow(["arm", "seeds"] + [f"{m}_{s}" for m in metrics for s in ("mean", "sd", "exceeds")])
    for r in rows:
        cells = []
        for m in metrics:
            st, flag = r.stats[m], r.exceeds[m]
            cells += [
                "" if st.mean is None else repr(st.mean),
                "" if st.spread is None else repr(st.spread),
                "" if flag is None else str(flag).lower(),
            ]
        w.writerow([r.arm, r.seeds] + cells)
    return buf.getvalue()
