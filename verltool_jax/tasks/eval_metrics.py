"""Per-family evaluation metrics: pure functions of finished trajectories and their
rewards (no I/O), so any evaluation loop can print them.

A trajectory is a :class:`verltool_jax.rollout.trajectory.Trajectory` or anything with
the same attributes (``tool_calls``, ``invalid_tool_calls``, ``observations``,
``termination``, ``data``); ``rewards`` are the task rewards in the same order
(:class:`~verltool_jax.rewards.base.RewardResult`, a float or None for a missing one).

SQL (:func:`sql_eval_metrics`)::

    sql/exec_acc              = correct / N                      (execution match)
    sql/exec_acc/<level>      = the same over the rows of Spider hardness <level>
    sql/count/<level>         = rows of that level
    sql/calls_per_question    = sum(tool calls) / N
    sql/error_rate            = SQL calls whose observation is an error / SQL calls
    sql/format_error_rate     = rows whose reward says the format was bad / N
    sql/exec_error_rate       = rows whose final SQL failed to run / N

SWE (:func:`swe_eval_metrics`)::

    swe/resolve_rate          = resolved / N   (reward > 0: hidden tests pass, none broke)
    swe/tool_calls_per_task   = sum(tool calls) / N
    swe/invalid_calls_per_task
    swe/ended/<termination>   = fraction of trajectories that ended that way
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from verltool_jax.rewards.base import RewardResult

SQL_ERROR_PREFIXES = ("SQL error:", "Error:")
HARDNESS_LEVELS = ("easy", "medium", "hard", "extra")


def _result(r: Any) -> Optional[RewardResult]:
    if r is None or isinstance(r, RewardResult):
        return r
    score = float(r)
    return RewardResult(score, score > 0)


def _extra_info(traj: Any) -> dict:
    data = getattr(traj, "data", None) or {}
    return dict(data.get("extra_info") or {})


def _check(trajectories: Sequence[Any], rewards: Sequence[Any]) -> list[Optional[RewardResult]]:
    if len(trajectories) != len(rewards):
        raise ValueError(f"got {len(trajectories)} trajectories but {len(rewards)} rewards; "
                         "pass one reward per trajectory, in order")
    return [_result(r) for r in rewards]


def is_sql_error(observation: str) -> bool:
    """True if an ``sql`` tool observation reports an error (the tool's own prefixes)."""
    return observation.lstrip().startswith(SQL_ERROR_PREFIXES)


def sql_eval_metrics(trajectories: Sequence[Any], rewards: Sequence[Any]) -> dict[str, float]:
    """Execution accuracy overall and by ``extra_info["hardness"]``, SQL calls per
    question and error rates (definitions in the module doc). Empty input: {}."""
    results = _check(trajectories, rewards)
    n = len(results)
    if n == 0:
        return {}
    correct = [bool(r and r.correct) for r in results]
    out = {"sql/exec_acc": sum(correct) / n}
    levels = [_extra_info(t).get("hardness") for t in trajectories]
    for level in HARDNESS_LEVELS:
        idx = [i for i, lv in enumerate(levels) if lv == level]
        out[f"sql/count/{level}"] = float(len(idx))
        if idx:
            out[f"sql/exec_acc/{level}"] = sum(correct[i] for i in idx) / len(idx)
    calls = sum(int(getattr(t, "tool_calls", 0)) for t in trajectories)
    out["sql/calls_per_question"] = calls / n
    obs = [o for t in trajectories for o in (getattr(t, "observations", None) or [])]
    out["sql/error_rate"] = (sum(is_sql_error(o) for o in obs) / len(obs)) if obs else 0.0
    out["sql/format_error_rate"] = sum(bool(r and r.info.get("format_error"))
                                       for r in results) / n
    out["sql/exec_error_rate"] = sum(bool(r and r.info.get("exec_error"))
                                     for r in results) / n
    return out


def swe_eval_metrics(trajectories: Sequence[Any], rewards: Sequence[Any]) -> dict[str, float]:
    """Resolve rate, tool calls per task and how trajectories ended (module doc)."""
    results = _check(trajectories, rewards)
    n = len(results)
    if n == 0:
        return {}
    out = {"swe/resolve_rate": sum(bool(r and r.score > 0) for r in results) / n,
           "swe/tool_calls_per_task": sum(int(getattr(t, "tool_calls", 0))
                                          for t in trajectories) / n,
           "swe/invalid_calls_per_task": sum(int(getattr(t, "invalid_tool_calls", 0))
                                             for t in trajectories) / n}
    ends = Counter(getattr(t, "termination", "") or "unknown" for t in trajectories)
    for how, k in sorted(ends.items()):
        out[f"swe/ended/{how}"] = k / n
    return out


def format_metrics(metrics: dict[str, float]) -> str:
    """One ``key=value`` line per metric, sorted, for printing."""
    return "\n".join(f"{k} = {v:.4f}" if isinstance(v, float) else f"{k} = {v}"
                     for k, v in sorted(metrics.items()))
