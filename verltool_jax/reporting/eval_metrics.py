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

  and what a task costs (means and medians over the N tasks; a trajectory's own record):

    swe/wall_s_per_task_*     = the trajectory's wall time (``wall_time_s``: first turn to
                                the hidden tests' end, waits for the sampler included)
    swe/sandbox_s_per_task_*  = time inside tool calls: the model's calls
                                (``tool_latencies``) plus the hidden test run
    swe/hidden_test_s_per_task_mean = the hidden test run alone
    swe/gen_s_per_task_mean   = time in the sampler (``gen_latencies``)
    swe/gen_tokens_per_task_* = tokens the policy sampled (``gen_tokens``)
    swe/wall_s_total          = the whole evaluation's wall time (when given)

  :func:`swe_task_costs` gives one trajectory's figures, :func:`format_swe_tasks` a table
  of them per task.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from verltool_jax.rewards.base import RewardResult

SQL_ERROR_PREFIXES = ("SQL error:", "Error:")
HARDNESS_LEVELS = ("easy", "medium", "hard", "extra")


def _result(r: Any) -> RewardResult | None:
    if r is None or isinstance(r, RewardResult):
        return r
    score = float(r)
    return RewardResult(score, score > 0)


def _extra_info(traj: Any) -> dict:
    data = getattr(traj, "data", None) or {}
    return dict(data.get("extra_info") or {})


def _check(trajectories: Sequence[Any], rewards: Sequence[Any]) -> list[RewardResult | None]:
    if len(trajectories) != len(rewards):
        raise ValueError(
            f"got {len(trajectories)} trajectories but {len(rewards)} rewards; "
            "pass one reward per trajectory, in order"
        )
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
    out["sql/format_error_rate"] = sum(bool(r and r.info.get("format_error")) for r in results) / n
    out["sql/exec_error_rate"] = sum(bool(r and r.info.get("exec_error")) for r in results) / n
    return out


def hidden_test_result(traj: Any) -> dict:
    """The hidden test run's metrics the agent loop stored for ``traj`` ({} if none)."""
    return dict(_extra_info(traj).get("hidden_test_result") or {})


def swe_task_costs(traj: Any) -> dict[str, float]:
    """One SWE trajectory's ``wall_s``, ``sandbox_s`` (its tool calls plus the hidden test
    run), ``hidden_test_s``, ``gen_s`` and ``gen_tokens``, from its record."""
    hidden_s = float(hidden_test_result(traj).get("seconds") or 0.0)
    return {
        "wall_s": float(getattr(traj, "wall_time_s", 0.0) or 0.0),
        "sandbox_s": sum(map(float, getattr(traj, "tool_latencies", None) or ())) + hidden_s,
        "hidden_test_s": hidden_s,
        "gen_s": sum(map(float, getattr(traj, "gen_latencies", None) or ())),
        "gen_tokens": float(sum(getattr(traj, "gen_tokens", None) or ())),
    }


def swe_eval_metrics(
    trajectories: Sequence[Any], rewards: Sequence[Any], wall_s_total: float | None = None
) -> dict[str, float]:
    """Resolve rate, tool calls per task, how trajectories ended and what a task cost in
    time and tokens (module doc); ``wall_s_total``: the whole evaluation's wall time."""
    results = _check(trajectories, rewards)
    n = len(results)
    if n == 0:
        return {}
    out = {
        "swe/resolve_rate": sum(bool(r and r.score > 0) for r in results) / n,
        "swe/tool_calls_per_task": sum(int(getattr(t, "tool_calls", 0)) for t in trajectories) / n,
        "swe/invalid_calls_per_task": sum(
            int(getattr(t, "invalid_tool_calls", 0)) for t in trajectories
        )
        / n,
    }
    ends = Counter(getattr(t, "termination", "") or "unknown" for t in trajectories)
    for how, k in sorted(ends.items()):
        out[f"swe/ended/{how}"] = k / n
    costs = [swe_task_costs(t) for t in trajectories]
    for key in ("wall_s", "sandbox_s", "gen_tokens"):
        vals = [c[key] for c in costs]
        out[f"swe/{key}_per_task_mean"] = sum(vals) / n
        out[f"swe/{key}_per_task_median"] = float(statistics.median(vals))
    for key in ("hidden_test_s", "gen_s"):
        out[f"swe/{key}_per_task_mean"] = sum(c[key] for c in costs) / n
    if wall_s_total is not None:
        out["swe/wall_s_total"] = float(wall_s_total)
    return out


def format_swe_tasks(trajectories: Sequence[Any], rewards: Sequence[Any]) -> str:
    """A plain-text table, one line per task: reward, tool calls, how it ended, tokens,
    wall / sandbox seconds and the hidden tests' passed/failed/errors (``timed out`` when
    the run was cut by the tool's timeout: its counts are lost; ``-`` when they did not
    run: a trajectory that ended in an error)."""
    results = _check(trajectories, rewards)
    lines = [
        f"{'task':28s} {'reward':>6s} {'calls':>5s} {'ended':>9s} {'tokens':>6s} "
        f"{'wall_s':>7s} {'sandbox_s':>9s}  hidden passed/failed/errors"
    ]
    for t, r in zip(trajectories, results):
        c, h = swe_task_costs(t), hidden_test_result(t)
        name = str(_extra_info(t).get("task_id") or getattr(t, "trajectory_id", "?"))
        lines.append(
            f"{name[:28]:28s} {(r.score if r else 0.0):6.1f} "
            f"{int(getattr(t, 'tool_calls', 0)):5d} "
            f"{(getattr(t, 'termination', '') or 'unknown')[:9]:>9s} "
            f"{int(c['gen_tokens']):6d} {c['wall_s']:7.2f} {c['sandbox_s']:9.2f}  "
            + (
                "-"
                if not h
                else "timed out"
                if h.get("timed_out")
                else f"{h.get('passed')}/{h.get('failed')}/{h.get('errors')}"
            )
        )
    return "\n".join(lines)


def format_metrics(metrics: dict[str, float]) -> str:
    """One ``key=value`` line per metric, sorted, for printing."""
    return "\n".join(
        f"{k} = {v:.4f}" if isinstance(v, float) else f"{k} = {v}"
        for k, v in sorted(metrics.items())
    )
