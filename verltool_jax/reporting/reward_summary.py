"""Batch reward metrics for logging (names from ``verltool_jax.reporting.names``).

reward/mean = mean score;  acc/mean = fraction correct;
reward/timeouts, reward/errors, reward/no_answer = counts;  reward/seconds_max;
reward/judge_* = the LLM judge's calls, cache hits, failures, latency, tokens and cost
(``rewards.judge.judge_metrics``; only when a judge graded the batch)
"""

from __future__ import annotations

from collections.abc import Sequence

from verltool_jax.reporting import names
from verltool_jax.rewards.base import RewardResult
from verltool_jax.rewards.judge import judge_metrics


def reward_metrics(results: Sequence[RewardResult], prefix: str = "") -> dict[str, float]:
    """The metrics of one batch of results (empty batch: empty dict). ``prefix`` e.g.
    ``"eval/"`` gives ``eval/reward/mean``; ``acc/mean`` then becomes ``eval/acc``."""
    if not results:
        return {}
    n = len(results)
    out = {
        names.REWARD: sum(r.score for r in results) / n,
        names.ACC: sum(1.0 for r in results if r.correct) / n,
        "reward/timeouts": float(sum(1 for r in results if r.info.get("timeout"))),
        "reward/errors": float(sum(1 for r in results if "error" in r.info)),
        "reward/no_answer": float(sum(1 for r in results if r.info.get("has_answer") is False)),
        "reward/seconds_max": max(float(r.info.get("seconds", 0.0)) for r in results),
    }
    out.update(judge_metrics([r.info for r in results], "reward"))
    if prefix:
        out = {
            (names.EVAL_ACC if k == names.ACC and prefix == "eval/" else prefix + k): v
            for k, v in out.items()
        }
    return out
