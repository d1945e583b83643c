"""How much learning signal a batch of groups carries.

A group-relative estimator (GRPO, Dr.GRPO, RLOO, ...) gives every trajectory of a group
advantage exactly 0 when the group's rewards are all equal (all failed or all solved), so
such a group adds nothing to the gradient. Per batch:

* ``signal/no_signal_frac`` = (groups with max reward == min reward) / groups;
* ``signal/zero_groups`` / ``signal/solved_groups``: groups whose every trajectory failed
  / succeeded (``acc`` 0 / 1) — which side the missing signal is on;
* ``signal/nonzero_adv`` = trajectories whose advantage is not 0;
* the pass-rate histogram: a group's pass rate is the mean of its trajectories'
  correctness; ``signal/pass_rate_<bin>`` is the fraction of groups in each bin of
  :data:`PASS_RATE_BINS` (``0``, ``(0,.25]``, ``(.25,.5]``, ``(.5,.75]``, ``(.75,1)``, ``1``).

:class:`NoSignalWatch` says so on the console when most groups carry no signal for
several steps in a row, naming the settings that would help.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verltool_jax import metric_names as names
from verltool_jax.metric_names import NO_SIGNAL_FRAC

# (name, lower bound exclusive, upper bound inclusive); 0 and 1 are their own bins
PASS_RATE_BINS: tuple[tuple[str, float, float], ...] = (
    ("0", -1.0, 0.0),
    ("0-25", 0.0, 0.25),
    ("25-50", 0.25, 0.5),
    ("50-75", 0.5, 0.75),
    ("75-99", 0.75, 1.0 - 1e-9),
    ("100", 1.0 - 1e-9, 1.0),
)


def pass_rate_histogram(rates: Sequence[float]) -> dict[str, float]:
    """Fraction of ``rates`` in each bin of :data:`PASS_RATE_BINS`, keyed by bin name."""
    r = np.asarray(rates, np.float64)
    if r.size == 0:
        return {name: 0.0 for name, _, _ in PASS_RATE_BINS}
    return {name: float(((r > lo) & (r <= hi)).mean()) for name, lo, hi in PASS_RATE_BINS}


def signal_metrics(
    rewards: Sequence[float],
    group_ids: Sequence[str],
    correct: Sequence[float],
    advantages: Sequence[float] | None = None,
) -> dict[str, float]:
    """The metrics of the module doc for one batch (trajectory-aligned sequences)."""
    rew = np.asarray(rewards, np.float64)
    cor = np.asarray(correct, np.float64)
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    flat = [rew[idx].max() == rew[idx].min() for idx in groups.values()]
    rates = [float(cor[idx].mean()) for idx in groups.values()]
    out = {
        NO_SIGNAL_FRAC: float(np.mean(flat)) if flat else 0.0,
        names.SIGNAL_ZERO_GROUPS: float(sum(r == 0.0 for r in rates)),
        names.SIGNAL_SOLVED_GROUPS: float(sum(r == 1.0 for r in rates)),
        names.SIGNAL_GROUPS: float(len(groups)),
    }
    if advantages is not None:
        out[names.SIGNAL_NONZERO_ADV] = float(np.count_nonzero(np.asarray(advantages)))
    out.update({f"signal/pass_rate_{k}": v for k, v in pass_rate_histogram(rates).items()})
    return out


class NoSignalWatch:
    """Counts steps in a row whose ``no_signal_frac`` exceeds ``frac``; after ``steps``
    of them :meth:`update` returns a warning (then again every ``steps`` more)."""

    def __init__(self, steps: int = 5, frac: float = 0.5):
        self.steps, self.frac = steps, frac
        self.run = 0

    def update(self, metrics: dict[str, float]) -> str | None:
        if self.steps <= 0 or NO_SIGNAL_FRAC not in metrics:
            return None
        if metrics[NO_SIGNAL_FRAC] <= self.frac:
            self.run = 0
            return None
        self.run += 1
        if self.run % self.steps:
            return None
        zero = metrics.get(names.SIGNAL_ZERO_GROUPS, 0.0)
        solved = metrics.get(names.SIGNAL_SOLVED_GROUPS, 0.0)
        side = (
            "most of them failed every sample (too hard)"
            if zero >= solved
            else "most of them solved every sample (too easy)"
        )
        return (
            f"no learning signal: in each of the last {self.run} steps more than "
            f"{self.frac:.0%} of the groups had equal rewards (advantage 0); {side}. "
            "What helps: easier (or harder) training data (task difficulty, or "
            "`python -m verltool_jax.passrate` to keep prompts with pass rates strictly "
            "between 0 and 1), more samples per prompt (rollout.n_samples), a higher "
            "sampling temperature (rollout.temperature), a longer SFT warm start "
            "(sft.steps), or the curriculum (curriculum.enabled)"
        )
