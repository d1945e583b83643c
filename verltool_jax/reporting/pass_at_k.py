"""Per-test-set evaluation metrics: accuracy, pass@k and tool-use rates.

``pass_at_k`` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
Models Trained on Code", the Codex paper, section 2.1); ``set_metrics`` groups scored
trajectories by their row's ``data_source`` (the test set) and summarises each set.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct:

        pass@k = 1 - C(n - c, k) / C(n, k)

    (the probability that at least one of ``k`` samples drawn without replacement from the
    ``n`` is correct), computed as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` so that no
    large binomial is formed (the Codex paper's numerically stable form). ``c > n - k``
    gives 1. Needs ``0 <= c <= n`` and ``1 <= k <= n``."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k needs ints, got n={n!r} c={c!r} k={k!r}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c} n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k} n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def set_name_of(traj: Any) -> str:
    """The test set a trajectory's row belongs to: the row's ``extra_info["set"]`` if it
    names one (e.g. a difficulty level), else its ``data_source`` (else ``unknown``)."""
    row = getattr(traj, "data", None) or {}
    named = (row.get("extra_info") or {}).get("set")
    return str(named or row.get("data_source") or "unknown")


def is_correct(traj: Any) -> bool:
    """A trajectory counts as correct when its reward info says ``acc`` > 0.5."""
    return float((traj.reward_info or {}).get("acc", 0.0)) > 0.5


def set_metrics(groups: Sequence[Sequence[Any]], k: int = 1) -> dict[str, dict[str, float]]:
    """Metrics per test set of scored rollout ``groups`` (one group = the ``n`` samples of
    one problem, all from the same set):

    * ``acc``: mean correctness over all samples (greedy: accuracy; sampled: pass@1 mean);
    * ``pass@k``: mean over problems of :func:`pass_at_k` (n = group size, c = correct);
    * ``tool_call_rate``: fraction of trajectories with at least one tool call;
    * ``invalid_call_rate``: invalid calls / all calls (0 without calls);
    * ``turns``, ``response_len``: means per trajectory; ``problems``, ``samples``: counts.
    """
    by_set: dict[str, list[Sequence[Any]]] = defaultdict(list)
    for g in groups:
        if g:
            by_set[set_name_of(g[0])].append(g)
    out: dict[str, dict[str, float]] = {}
    for name in sorted(by_set):
        gs = by_set[name]
        trajs = [t for g in gs for t in g]
        calls = sum(t.tool_calls for t in trajs)
        m = {
            "problems": len(gs),
            "samples": len(trajs),
            "acc": float(np.mean([is_correct(t) for t in trajs])),
            "tool_call_rate": float(np.mean([t.tool_calls > 0 for t in trajs])),
            "invalid_call_rate": sum(t.invalid_tool_calls for t in trajs) / calls if calls else 0.0,
            "turns": float(np.mean([t.num_turns for t in trajs])),
            "response_len": float(np.mean([len(t.response_ids) for t in trajs])),
        }
        if all(len(g) >= k for g in gs):
            m[f"pass@{k}"] = float(
                np.mean([pass_at_k(len(g), sum(map(is_correct, g)), k) for g in gs])
            )
        out[name] = m
    return out


def format_set_table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """A plain-text table: one line per (mode, set) of ``{mode: set_metrics(...)}``."""
    cols = (
        "problems",
        "samples",
        "acc",
        "tool_call_rate",
        "invalid_call_rate",
        "turns",
        "response_len",
    )
    lines = []
    for mode, sets in results.items():
        for name, m in sets.items():
            extra = {k: v for k, v in m.items() if k.startswith("pass@")}
            parts = [
                f"{c}={m[c]:.3f}" if isinstance(m[c], float) else f"{c}={m[c]}" for c in cols
            ] + [f"{k}={v:.3f}" for k, v in extra.items()]
            lines.append(f"{mode:<10} {name:<10} " + " ".join(parts))
    return "\n".join(lines)
