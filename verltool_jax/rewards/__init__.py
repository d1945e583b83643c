"""Rewards: a registry keyed by data_source or config name, and parallel scoring.

Built in: ``math`` (``<answer>``/``\\boxed{}``, numeric and symbolic equivalence),
``qa_em`` / ``qa_f1`` (SQuAD normalisation), ``sql`` (execution match on sqlite),
``env_reward`` (the rewards an environment behind a tool returned), plus
shaping (format penalty, tool-use term). ``RewardPool`` / ``compute_rewards`` score
batches in worker processes with a per-item timeout.
"""

from verltool_jax.rewards import (  # noqa: F401  (register)
    env_reward,
    math_reward,
    qa_reward,
    reasoning_gym_reward,
    sql_reward,
    swe_reward,
    visual_reward,
)
from verltool_jax.rewards.answer_extraction import extract_answer, last_boxed
from verltool_jax.rewards.base import (
    DATA_SOURCES,
    REWARDS,
    RewardResult,
    get_reward_fn,
    register_data_source,
    register_reward,
    resolve_reward_name,
)
from verltool_jax.rewards.compute import (
    RewardItem,
    RewardPool,
    assign_rewards,
    compute_rewards,
    items_from,
    make_item,
)
from verltool_jax.rewards.shaping import ShapingSettings, shaped_score

__all__ = [
    "DATA_SOURCES",
    "REWARDS",
    "RewardItem",
    "RewardPool",
    "RewardResult",
    "ShapingSettings",
    "assign_rewards",
    "compute_rewards",
    "extract_answer",
    "get_reward_fn",
    "items_from",
    "last_boxed",
    "make_item",
    "register_data_source",
    "register_reward",
    "resolve_reward_name",
    "shaped_score",
]
