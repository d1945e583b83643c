"""Group-relative advantage estimators (outcome rewards, one scalar per sequence).

All samples of one prompt form a group. With ``r`` the rewards of a group of ``n``:

* ``grpo``:    A_i = (r_i - mean(r)) / (std(r) + 1e-6), std unbiased (divides by n-1)
* ``drgrpo``:  A_i = r_i - mean(r)                       (Dr.GRPO: no std division)
* ``rloo``:    A_i = r_i - (sum(r) - r_i) / (n - 1)      (leave-one-out baseline)

A group of one sample has no baseline and gets advantage 0 in every estimator.
Functions are pure and jittable: groups are given as an integer index per sample
(``group_index[i]`` in ``[0, num_groups)``, ``num_groups`` static). The per-sequence
advantage is spread over the response tokens with :func:`broadcast_to_tokens`.
Select by name with :func:`get_advantage_fn` (config field ``algo.adv_estimator``).
"""
from __future__ import annotations

from typing import Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from verltool_jax.algos.registry import Registry

GRPO_EPS = 1e-6

AdvantageFn = Callable[[jax.Array, jax.Array, int], jax.Array]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator", "algo.adv_estimator")


def _group_stats(rewards: jax.Array, group_index: jax.Array, num_groups: int):
    """Per-sample (count n_g, sum S_g, mean m_g) of the sample's group, float32 [N] each."""
    r = rewards.astype(jnp.float32)
    count = jax.ops.segment_sum(jnp.ones_like(r), group_index, num_segments=num_groups)
    total = jax.ops.segment_sum(r, group_index, num_segments=num_groups)
    mean = total / jnp.maximum(count, 1.0)
    return count[group_index], total[group_index], mean[group_index]


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: jax.Array, group_index: jax.Array, num_groups: int) -> jax.Array:
    """GRPO: A_i = (r_i - mean_g) / (std_g + 1e-6), std_g = sqrt(sum (r-mean_g)^2 / (n_g-1)).

    A group with n_g == 1 gets 0. Returns float32 [N].
    """
    r = rewards.astype(jnp.float32)
    n, _, mean = _group_stats(r, group_index, num_groups)
    sq = jax.ops.segment_sum((r - mean) ** 2, group_index, num_segments=num_groups)[group_index]
    std = jnp.sqrt(sq / jnp.maximum(n - 1.0, 1.0))
    return jnp.where(n > 1, (r - mean) / (std + GRPO_EPS), 0.0)


@ADVANTAGES.register("drgrpo", "dr_grpo", "dr-grpo")
def drgrpo_advantages(rewards: jax.Array, group_index: jax.Array, num_groups: int) -> jax.Array:
    """Dr.GRPO: A_i = r_i - mean_g (no std normalisation). A group of one gets 0."""
    r = rewards.astype(jnp.float32)
    n, _, mean = _group_stats(r, group_index, num_groups)
    return jnp.where(n > 1, r - mean, 0.0)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: jax.Array, group_index: jax.Array, num_groups: int) -> jax.Array:
    """RLOO: A_i = r_i - (S_g - r_i) / (n_g - 1), the mean of the *other* samples.

    Equals n_g / (n_g - 1) * (r_i - mean_g). A group of one gets 0.
    """
    r = rewards.astype(jnp.float32)
    n, total, _ = _group_stats(r, group_index, num_groups)
    return jnp.where(n > 1, r - (total - r) / jnp.maximum(n - 1.0, 1.0), 0.0)


def get_advantage_fn(name: str) -> AdvantageFn:
    """The estimator registered as ``name`` (grpo | drgrpo | rloo)."""
    return ADVANTAGES.get(name)


def group_indices(group_ids: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """Map arbitrary group ids (e.g. ``Trajectory.group_id`` strings) to ``0..G-1``.

    Returns ``(index [N] int32, G)``; indices follow first appearance.
    """
    table: dict[Hashable, int] = {}
    idx = np.array([table.setdefault(g, len(table)) for g in group_ids], dtype=np.int32)
    return idx, len(table)


def compute_advantages(name: str, rewards: Sequence[float] | np.ndarray,
                       group_ids: Sequence[Hashable]) -> np.ndarray:
    """Host-side convenience: advantages [N] (float32 numpy) of ``rewards`` grouped by id."""
    rewards = np.asarray(rewards, dtype=np.float32)
    if rewards.ndim != 1 or len(rewards) != len(group_ids):
        raise ValueError(f"rewards must be 1-D with one entry per group id; got shape "
                         f"{rewards.shape} and {len(group_ids)} group ids")
    if not np.all(np.isfinite(rewards)):
        raise ValueError("rewards contain NaN/inf; fix the reward function (or drop those "
                         "trajectories) before computing advantages")
    idx, g = group_indices(group_ids)
    return np.array(get_advantage_fn(name)(jnp.asarray(rewards), jnp.asarray(idx), g))


def broadcast_to_tokens(advantages: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Per-token advantages [B,T]: A[b] * loss_mask[b,t]; an input already [B,T] is masked."""
    adv = advantages.astype(jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    return adv * loss_mask.astype(jnp.float32)
