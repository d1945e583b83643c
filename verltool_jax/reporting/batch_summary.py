"""The summary of a batch of scored trajectories: the trainer's per-step rollout metrics
(``train/metrics.rollout_metrics``), its held-out evaluation and ``python -m
verltool_jax.eval`` all report through :func:`summarize`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verltool_jax.rewards.judge import judge_metrics
from verltool_jax.rollout.trajectory import Trajectory


def summarize(trajs: Sequence[Trajectory], prefix: str) -> dict:
    """The one summary of a batch of scored trajectories, under ``{prefix}/``: mean
    reward and accuracy, mean tool calls, invalid calls, turns and response length, the
    count, the fraction of each termination, the reward's failures (counts of
    ``reward_timeouts``, ``reward_errors`` and ``no_answer`` from each trajectory's
    ``reward_info``), and the LLM judge's calls, cache hits, failures, latency, tokens
    and cost (only when a judge graded the batch; ``rewards.judge.judge_metrics``).
    Empty batch: empty dict."""
    if not trajs:
        return {}
    r = np.array([t.reward or 0.0 for t in trajs], np.float64)
    acc = np.array([t.reward_info.get("acc", 0.0) for t in trajs], np.float64)
    out = {
        f"{prefix}/reward": float(r.mean()),
        f"{prefix}/acc": float(acc.mean()),
        f"{prefix}/tool_calls": float(np.mean([t.tool_calls for t in trajs])),
        f"{prefix}/invalid_tool_calls": float(np.mean([t.invalid_tool_calls for t in trajs])),
        f"{prefix}/turns": float(np.mean([t.num_turns for t in trajs])),
        f"{prefix}/response_len": float(np.mean([len(t.response_ids) for t in trajs])),
        f"{prefix}/num": len(trajs),
    }
    infos = [t.reward_info or {} for t in trajs]
    out[f"{prefix}/reward_timeouts"] = float(sum(1 for i in infos if i.get("timeout")))
    out[f"{prefix}/reward_errors"] = float(sum(1 for i in infos if "error" in i))
    out[f"{prefix}/no_answer"] = float(sum(1 for i in infos if i.get("has_answer") is False))
    for reason in sorted({t.termination for t in trajs}):
        out[f"{prefix}/term_{reason}"] = sum(t.termination == reason for t in trajs) / len(trajs)
    out.update(judge_metrics(infos, prefix))
    return out
