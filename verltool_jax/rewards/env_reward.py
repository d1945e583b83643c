"""``env_reward``: the reward an environment gave, for rows whose data_source is ``openenv``;
``program_reward``: the reward an agent program gave, for rows whose data_source is
``verifiers``.

An environment behind a tool (the ``openenv`` tool: an OpenEnv server's episode) scores
each step itself and returns the step's reward in the observation payload
(``{"obs": ..., "reward": r}``); the trajectory keeps those payloads and scoring passes
their rewards as ``extra_info["tool_rewards"]`` (:func:`verltool_jax.rewards.compute.make_item`).

Reward = sum of the steps' rewards, the return of the episode with discount 1 (an OpenEnv
episode's return; verl has no counterpart). ``correct`` = the return is > 0. A
trajectory that never reached the environment gets 0. The response text is not read:
the environment judged the actions when it stepped.

An agent program trained through the gateway may return a reward (a verifiers
environment's program returns its rubric's: ``verltool_jax/tasks/verifiers_task.py``);
scoring passes it as ``extra_info["program_reward"]``. ``program_reward`` is that number
(0 when there is none), ``correct`` = it is > 0, so the logged accuracy and the held-out
evaluation read the environment's own judgement.
"""

from __future__ import annotations

import math
from typing import Any

from verltool_jax.rewards.base import RewardResult, register_reward

DATA_SOURCE = "openenv"
TOOL_REWARDS = "tool_rewards"  # the extra_info key scoring fills from the trajectory
PROGRAM_DATA_SOURCE = "verifiers"
PROGRAM_REWARD = "program_reward"  # the extra_info key of the agent program's reward


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


@register_reward("program_reward", PROGRAM_DATA_SOURCE)
def program_reward(text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    value = extra_info.get(PROGRAM_REWARD)
    r = 0.0 if value is None else float(value)
    if not math.isfinite(r):
        raise ValueError(f"the agent program gave a non-finite reward {r!r}")
    return RewardResult(r, r > 0, {"program_gave_reward": value is not None})
