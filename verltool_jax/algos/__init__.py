"""Pure, jittable RL math: advantages, policy losses, KL estimators, loss aggregation.

Each family is selectable by name from the config through its registry
(``get_advantage_fn``, ``get_policy_loss``, ``get_kl_fn``, ``aggregate(mode=...)``).
"""

from verltool_jax.algos.advantages import (
    broadcast_to_tokens,
    compute_advantages,
    get_advantage_fn,
    group_indices,
)
from verltool_jax.algos.aggregation import Normaliser, aggregate, normaliser_for
from verltool_jax.algos.dapo import informative_groups, overlong_penalty
from verltool_jax.algos.kl import entropy_from_logits, get_kl_fn
from verltool_jax.algos.policy_loss import PolicyLossConfig, get_policy_loss, truncated_is_weights

__all__ = [
    "broadcast_to_tokens",
    "compute_advantages",
    "get_advantage_fn",
    "group_indices",
    "Normaliser",
    "aggregate",
    "normaliser_for",
    "informative_groups",
    "overlong_penalty",
    "entropy_from_logits",
    "get_kl_fn",
    "PolicyLossConfig",
    "get_policy_loss",
    "truncated_is_weights",
]
