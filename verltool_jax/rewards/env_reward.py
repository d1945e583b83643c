"""``env_reward``: the reward an environment gave, for rows whose data_source is ``openenv``.

An environment behind a tool (the ``openenv`` tool: an OpenEnv server's episode) scores
each step itself and returns the step's reward in the observation payload
(``{"obs": ..., "reward": r}``); the trajectory keeps those payloads and scoring passes
their rewards as ``extra_info["tool_rewards"]`` (:func:`verltool_jax.rewards.compute.make_item`).

Reward = sum of the steps' rewards, the return of the episode with discount 1 (an OpenEnv
episode's return; verl has no counterpart). ``correct`` = the return is > 0. A
trajectory that never reached the environment gets 0. The response text is not read:
the environment judged the actions when it stepped.
"""

from __future__ import annotations

import math
from typing import Any

from verltool_jax.rewards.base import RewardResult, register_reward

DATA_SOURCE = "openenv"
TOOL_REWARDS = "tool_rewards"  # the extra_info key scoring fills from the trajectory


def episode_return(rewards: list[float]) -> float:
    """``sum_t r_t`` over the steps' rewards; a non-finite reward is a ValueError."""
    total = 0.0
    for i, r in enumerate(rewards):
        r = float(r)
        if not math.isfinite(r):
            raise ValueError(f"step {i} of the episode has a non-finite reward {r!r}")
        total += r
    return total


@register_reward("env_reward", DATA_SOURCE)
def env_reward(text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    rewards = list(extra_info.get(TOOL_REWARDS) or [])
    ret = episode_return(rewards)
    return RewardResult(ret, ret > 0, {"steps_rewarded": len(rewards)})
