"""Group-relative advantage estimators (outcome rewards, one scalar per sequence).

All samples of one prompt form a group. With ``r`` the rewards of a group of ``n``:

* ``grpo``:    A_i = (r_i - mean(r)) / (std(r) + 1e-6), std unbiased (divides by n-1);
               follows verl ``core_algos.compute_grpo_outcome_advantage``
               (``norm_adv_by_std_in_grpo=True``, epsilon 1e-6)
* ``drgrpo``:  A_i = r_i - mean(r)                       (Dr.GRPO: no std division);
               follows the same verl function with ``norm_adv_by_std_in_grpo=False``
* ``rloo``:    A_i = r_i - (sum(r) - r_i) / (n - 1)      (leave-one-out baseline)
               = n / (n - 1) * (r_i - mean(r)); follows verl
               ``core_algos.compute_rloo_outcome_advantage``

Deliberate differences from verl, both for groups that carry no learning signal:

* The rewards are centred on a group pivot p_g (the group's maximum) before any sum:
  d_i = r_i - p_g, and every formula above is evaluated on d (it is shift-invariant, so
  the value is the same in exact arithmetic). A group whose rewards are all equal then
  has d = 0 exactly and gets advantage exactly 0 for *any* float reward, where
  mean(r) computed in float32 can be one ulp off r (e.g. all rewards 123.456) and
  GRPO would divide that rounding error by std + 1e-6 ~ 1e-6 (verl does).
* A group of one sample has no baseline and gets advantage 0 in every estimator (verl
  uses mean 0 and std 1 there, i.e. A = r / (1 + 1e-6) for GRPO, A = r for Dr.GRPO
  and RLOO):
  a lone sample's raw reward is not a relative advantage.

Functions are pure and jittable: groups are given as an integer index per sample
(``group_index[i]`` in ``[0, num_groups)``, ``num_groups`` static). The per-sequence
advantage is spread over the response tokens with :func:`broadcast_to_tokens`.
Select by name with :func:`get_advantage_fn` (config field ``algo.adv_estimator``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from verltool_jax.algos.registry import Registry

GRPO_EPS = 1e-6

AdvantageFn = Callable[[jax.Array, jax.Array, int], jax.Array]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator", "algo.adv_estimator")


class GroupStats(NamedTuple):
    """Per-sample statistics of the sample's group, float32 [N] each.

    ``d``: r_i - p_g, the reward centred on the group pivot p_g = max(r in group);
    ``size``: n_g; ``total``: sum of d over the group; ``mean``: total / n_g.
    """

    d: jax.Array
    size: jax.Array
    total: jax.Array
    mean: jax.Array


def group_stats(rewards: jax.Array, group_index: jax.Array, num_groups: int) -> GroupStats:
    """Pivot-centred group statistics (see :class:`GroupStats`).

    Centring on a member of the group makes an all-equal group's ``d``, ``total`` and
    ``mean`` exactly 0, so every estimator built on them gives that group exactly 0.
    """
    r = rewards.astype(jnp.float32)
    pivot = jax.ops.segment_max(r, group_index, num_segments=num_groups)[group_index]
    d = r - pivot
    count = jax.ops.segment_sum(jnp.ones_like(d), group_index, num_segments=num_groups)
    total = jax.ops.segment_sum(d, group_index, num_segments=num_groups)
    mean = total / jnp.maximum(count, 1.0)
    return GroupStats(d, count[group_index], total[group_index], mean[group_index])


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: jax.Array, group_index: jax.Array, num_groups: int) -> jax.Array:
    """GRPO: A_i = (d_i - mean_g(d)) / (std_g(d) + 1e-6), std_g = sqrt(sum (d-mean)^2 / (n_g-1)).

    d = r - p_g (pivot-centred, module docstring); follows verl
    ``core_algos.compute_grpo_outcome_advantage``. A group with n_g == 1 gets 0
    (verl: r / (1 + 1e-6)).
    Returns float32 [N].
    """
    st = group_stats(rewards, group_index, num_groups)
    dev = st.d - st.mean
    sq = jax.ops.segment_sum(dev**2, group_index, num_segments=num_groups)[group_index]
    std = jnp.sqrt(sq / jnp.maximum(st.size - 1.0, 1.0))
    return jnp.where(st.size > 1, dev / (std + GRPO_EPS), 0.0)


@ADVANTAGES.register("drgrpo", "dr_grpo", "dr-grpo")
def drgrpo_advantages(rewards: jax.Array, group_index: jax.Array, num_groups: int) -> jax.Array:
    """Dr.GRPO: A_i = d_i - mean_g(d) = r_i - mean_g(r) (no std normalisation).

    Follows verl ``core_algos.compute_grpo_outcome_advantage`` with
    ``norm_adv_by_std_in_grpo=False``. A group of one gets 0 (verl: r).
    """
    st = group_stats(rewards, group_index, num_groups)
    return jnp.where(st.size > 1, st.d - st.mean, 0.0)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: jax.Array, group_index: jax.Array, num_groups: int) -> jax.Array:
    """RLOO: A_i = d_i - (S_g - d_i) / (n_g - 1), the mean of the *other* samples.

    Equals n_g / (n_g - 1) * (r_i - mean_g); follows verl
    ``core_algos.compute_rloo_outcome_advantage``. A group of one gets 0 (verl: r).
    """
    st = group_stats(rewards, group_index, num_groups)
    return jnp.where(st.size > 1, st.d - (st.total - st.d) / jnp.maximum(st.size - 1.0, 1.0), 0.0)


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


def compute_advantages(
    name: str, rewards: Sequence[float] | np.ndarray, group_ids: Sequence[Hashable]
) -> np.ndarray:
    """Host-side convenience: advantages [N] (float32 numpy) of ``rewards`` grouped by id."""
    rewards = np.asarray(rewards, dtype=np.float32)
    if rewards.ndim != 1 or len(rewards) != len(group_ids):
        raise ValueError(
            f"rewards must be 1-D with one entry per group id; got shape "
            f"{rewards.shape} and {len(group_ids)} group ids"
        )
    if not np.all(np.isfinite(rewards)):
        raise ValueError(
            "rewards contain NaN/inf; fix the reward function (or drop those "
            "trajectories) before computing advantages"
        )
    idx, g = group_indices(group_ids)
    return np.array(get_advantage_fn(name)(jnp.asarray(rewards), jnp.asarray(idx), g))


def broadcast_to_tokens(advantages: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Per-token advantages [B,T]: A[b] * loss_mask[b,t]; an input already [B,T] is masked."""
    adv = advantages.astype(jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    return adv * loss_mask.astype(jnp.float32)
