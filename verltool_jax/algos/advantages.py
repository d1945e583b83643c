"""Outcome-reward advantage estimators (one scalar reward and advantage per sequence).

Group-relative estimators: all samples of one prompt form a group. With ``r`` the
rewards of a group of ``n``:

* ``grpo``:    A_i = (r_i - mean(r)) / (std(r) + 1e-6), std unbiased (divides by n-1);
               follows verl ``core_algos.compute_grpo_outcome_advantage``
               (``norm_adv_by_std_in_grpo=True``, epsilon 1e-6)
* ``drgrpo``:  A_i = r_i - mean(r)                       (Dr.GRPO: no std division);
               follows the same verl function with ``norm_adv_by_std_in_grpo=False``
* ``rloo``:    A_i = r_i - (sum(r) - r_i) / (n - 1)      (leave-one-out baseline)
               = n / (n - 1) * (r_i - mean(r)); follows verl
               ``core_algos.compute_rloo_outcome_advantage``

REINFORCE++ (Hu et al. 2025, https://arxiv.org/abs/2501.03262): a global-batch baseline,
whitened over the *tokens* of the batch, with ``n_b`` the loss-mask tokens of sequence b
and ``N = sum_b n_b``:

* ``reinforce_plus_plus``: c_b = r_b; follows verl
  ``core_algos.compute_reinforce_plus_plus_outcome_advantage`` with ``gamma = 1``
* ``reinforce_plus_plus_baseline``: c_b = r_b - mean_g(r) (the group mean is subtracted
  first); follows verl ``core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage``

  then A_b = (c_b - mu) / sqrt(var + 1e-8), mu = sum_b n_b c_b / N,
  var = sum_b n_b (c_b - mu)^2 / (N - 1)  (verl ``masked_whiten`` of c_b spread over
  the response tokens: a token-weighted mean and unbiased variance over the batch).

  With an outcome reward and gamma = 1 (verl's default ``algorithm.gamma``) every
  response token of a sequence has return r_b, so verl's per-token advantage is this
  A_b on each of them; verl's token-level discount gamma < 1 is not offered (for
  multi-turn trajectories the per-turn discount ``algo.turn_discount`` is,
  :mod:`verltool_jax.algos.credit`). A batch with fewer than 2 loss-mask tokens
  has no variance and gets 0 (verl raises).

Deliberate differences from verl (the first two for groups that carry no signal):

* The rewards are centred on a group pivot p_g (the group's maximum) before any sum:
  d_i = r_i - p_g, and every formula above is evaluated on d (it is shift-invariant, so
  the value is the same in exact arithmetic). A group whose rewards are all equal then
  has d = 0 exactly and gets advantage exactly 0 for *any* float reward, where
  mean(r) computed in float32 can be one ulp off r (e.g. all rewards 123.456) and
  GRPO would divide that rounding error by std + 1e-6 ~ 1e-6 (verl does).
* A group of one sample has no baseline and gets advantage 0 in every group estimator
  (verl uses mean 0 and std 1 there, i.e. A = r / (1 + 1e-6) for GRPO, A = r for Dr.GRPO
  and RLOO); in ``reinforce_plus_plus_baseline`` its centred score c_b is 0 (verl: r_b)
  before the batch whitening: a lone sample's raw reward is not a relative advantage.
* ``reinforce_plus_plus`` centres the rewards on the batch maximum before the whitening
  (shift-invariant), so a batch whose rewards are all equal gets exactly 0.
* verl puts the outcome reward on the last response token; when that token was not
  sampled (a trajectory that ends in an observation, or in a tag closed on the model's
  behalf) verl's REINFORCE++ recursion drops it and the sequence's return is 0. Here
  every sampled token of the sequence gets r_b.

Functions are pure and jittable: groups are given as an integer index per sample
(``group_index[i]`` in ``[0, num_groups)``, ``num_groups`` static), and
``token_counts[i]`` is the number of loss-mask tokens of sample i (read by the
REINFORCE++ estimators, ignored by the group ones). The per-sequence
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

WHITEN_EPS = 1e-8  # verl masked_whiten: (x - mean) * rsqrt(var + 1e-8)

# (rewards [N], group_index [N] int, num_groups, token_counts [N] | None) -> advantages [N]
AdvantageFn = Callable[..., jax.Array]
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
def grpo_advantages(
    rewards: jax.Array,
    group_index: jax.Array,
    num_groups: int,
    token_counts: jax.Array | None = None,
) -> jax.Array:
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
def drgrpo_advantages(
    rewards: jax.Array,
    group_index: jax.Array,
    num_groups: int,
    token_counts: jax.Array | None = None,
) -> jax.Array:
    """Dr.GRPO: A_i = d_i - mean_g(d) = r_i - mean_g(r) (no std normalisation).

    Follows verl ``core_algos.compute_grpo_outcome_advantage`` with
    ``norm_adv_by_std_in_grpo=False``. A group of one gets 0 (verl: r).
    """
    st = group_stats(rewards, group_index, num_groups)
    return jnp.where(st.size > 1, st.d - st.mean, 0.0)


@ADVANTAGES.register("rloo")
def rloo_advantages(
    rewards: jax.Array,
    group_index: jax.Array,
    num_groups: int,
    token_counts: jax.Array | None = None,
) -> jax.Array:
    """RLOO: A_i = d_i - (S_g - d_i) / (n_g - 1), the mean of the *other* samples.

    Equals n_g / (n_g - 1) * (r_i - mean_g); follows verl
    ``core_algos.compute_rloo_outcome_advantage``. A group of one gets 0 (verl: r).
    """
    st = group_stats(rewards, group_index, num_groups)
    return jnp.where(st.size > 1, st.d - (st.total - st.d) / jnp.maximum(st.size - 1.0, 1.0), 0.0)


def token_whiten(values: jax.Array, token_counts: jax.Array) -> jax.Array:
    """verl ``masked_whiten`` of per-sequence values spread over their tokens.

    x_b is on each of sequence b's n_b tokens, N = sum_b n_b:
    (x_b - mu) / sqrt(var + 1e-8), mu = sum_b n_b x_b / N,
    var = sum_b n_b (x_b - mu)^2 / (N - 1) (unbiased, as ``masked_var``).
    Returns float32 [N_seq]; all 0 when N < 2 (no variance; verl raises).
    """
    x = values.astype(jnp.float32)
    w = token_counts.astype(jnp.float32)
    n = w.sum()
    mu = (w * x).sum() / jnp.maximum(n, 1.0)
    var = (w * (x - mu) ** 2).sum() / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(n >= 2.0, (x - mu) * jax.lax.rsqrt(var + WHITEN_EPS), 0.0)


def _need_counts(token_counts: jax.Array | None, rewards: jax.Array, name: str) -> jax.Array:
    if token_counts is None:
        raise ValueError(
            f"advantage estimator {name!r} whitens over the batch's tokens and needs "
            "token_counts (loss-mask tokens per sequence); pass "
            "compute_advantages(..., token_counts=...)"
        )
    if jnp.shape(token_counts) != jnp.shape(rewards):
        raise ValueError(
            f"token_counts has shape {jnp.shape(token_counts)}, rewards {jnp.shape(rewards)}: "
            "give one count per sequence"
        )
    return token_counts


@ADVANTAGES.register("reinforce_plus_plus")
def reinforce_pp_advantages(
    rewards: jax.Array,
    group_index: jax.Array,
    num_groups: int,
    token_counts: jax.Array | None = None,
) -> jax.Array:
    """REINFORCE++: A_b = whiten_tokens(r_b) (no groups; :func:`token_whiten`).

    Follows verl ``core_algos.compute_reinforce_plus_plus_outcome_advantage`` with
    ``gamma = 1`` (https://arxiv.org/abs/2501.03262). The rewards are centred on the
    batch maximum first (shift-invariant), so an all-equal batch gets exactly 0.
    ``group_index`` / ``num_groups`` are not read. Returns float32 [N].
    """
    counts = _need_counts(token_counts, rewards, "reinforce_plus_plus")
    r = rewards.astype(jnp.float32)
    return token_whiten(r - jnp.max(r), counts)


@ADVANTAGES.register("reinforce_plus_plus_baseline")
def reinforce_pp_baseline_advantages(
    rewards: jax.Array,
    group_index: jax.Array,
    num_groups: int,
    token_counts: jax.Array | None = None,
) -> jax.Array:
    """REINFORCE++ with the group-mean baseline: A_b = whiten_tokens(r_b - mean_g(r)).

    Follows verl ``core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage``
    (https://arxiv.org/abs/2501.03262): the group mean is subtracted per sequence, then
    the result is whitened over the batch's tokens (:func:`token_whiten`). A group of one
    has centred score 0 (verl: r_b). An all-equal group has centred score exactly 0, but
    the whitening shifts it by -mu / sigma like every other sequence (as verl).
    Returns float32 [N].
    """
    counts = _need_counts(token_counts, rewards, "reinforce_plus_plus_baseline")
    st = group_stats(rewards, group_index, num_groups)
    centred = jnp.where(st.size > 1, st.d - st.mean, 0.0)
    return token_whiten(centred, counts)


# Estimators whose baseline is the sample's group: with one sample per prompt
# (rollout.n_samples = 1) every advantage is 0.
GROUP_ESTIMATORS = frozenset(
    {"grpo", "drgrpo", "dr_grpo", "dr-grpo", "rloo", "reinforce_plus_plus_baseline"}
)


def get_advantage_fn(name: str) -> AdvantageFn:
    """The estimator registered as ``name`` (``ADVANTAGES.names()`` lists them)."""
    return ADVANTAGES.get(name)


def group_indices(group_ids: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """Map arbitrary group ids (e.g. ``Trajectory.group_id`` strings) to ``0..G-1``.

    Returns ``(index [N] int32, G)``; indices follow first appearance.
    """
    table: dict[Hashable, int] = {}
    idx = np.array([table.setdefault(g, len(table)) for g in group_ids], dtype=np.int32)
    return idx, len(table)


def compute_advantages(
    name: str,
    rewards: Sequence[float] | np.ndarray,
    group_ids: Sequence[Hashable],
    token_counts: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """Host-side convenience: advantages [N] (float32 numpy) of ``rewards`` grouped by id.

    ``token_counts``: loss-mask tokens per sequence (needed by the REINFORCE++ estimators,
    which whiten over tokens; ignored by the group estimators)."""
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
    counts: jax.Array | None = None
    if token_counts is not None:
        host = np.asarray(token_counts, dtype=np.float32)
        if host.shape != rewards.shape or np.any(host < 0):
            raise ValueError(
                f"token_counts must be one count >= 0 per reward; got shape {host.shape} "
                f"for {rewards.shape} rewards (min {host.min() if host.size else None})"
            )
        counts = jnp.asarray(host)
    fn = get_advantage_fn(name)
    if len(rewards) == 0:
        return np.zeros(0, np.float32)
    idx, g = group_indices(group_ids)
    return np.array(fn(jnp.asarray(rewards), jnp.asarray(idx), g, counts))


def episode_advantages(
    name: str,
    rewards: Sequence[float] | np.ndarray,
    group_ids: Sequence[Hashable],
    episode_ids: Sequence[Hashable],
    token_counts: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """:func:`compute_advantages` with each *episode* counted once, its advantage given to
    every row (piece) of it.

    An agent program's episode that the gateway split at a template break is several
    rows with one group id and one reward (docs/gateway.md). Counting every piece would
    weigh a split episode k times in its group's mean and std (and in the batch
    statistics of REINFORCE++), so: episode e has reward R_e = mean of its rows' rewards
    (equal unless a per-row term such as the overlong penalty differs), token count
    n_e = sum of its rows', and its group's id; A_e = estimator over the episodes; row b
    of episode e gets A_b = A_e. Every token of the episode is then trained once with
    the advantage a single-sequence episode would have had. With one row per episode
    this is ``compute_advantages`` itself. (verl has no such split; rLLM and AReaL give
    each step of a multi-step episode the episode's advantage the same way.)"""
    rewards = np.asarray(rewards, dtype=np.float32)
    if not (len(rewards) == len(group_ids) == len(episode_ids)):
        raise ValueError(
            f"one reward, group id and episode id per row; got {len(rewards)}, "
            f"{len(group_ids)}, {len(episode_ids)}"
        )
    eidx, n_ep = group_indices(episode_ids)
    eidx = np.asarray(eidx)
    if len(rewards) == n_ep:  # no split episode: the plain estimator
        return compute_advantages(name, rewards, group_ids, token_counts)
    first = np.full(n_ep, -1)
    for row in range(len(rewards) - 1, -1, -1):
        first[eidx[row]] = row
    gids = [group_ids[r] for r in first]
    if any(group_ids[r] != gids[e] for r, e in enumerate(eidx)):
        raise ValueError("the pieces of one episode must share its group id")
    size = np.bincount(eidx, minlength=n_ep).astype(np.float32)
    ep_r = np.bincount(eidx, weights=rewards, minlength=n_ep).astype(np.float32) / size
    ep_n = None
    if token_counts is not None:
        counts = np.asarray(token_counts, dtype=np.float32)
        ep_n = np.bincount(eidx, weights=counts, minlength=n_ep).astype(np.float32)
    return compute_advantages(name, ep_r, gids, ep_n)[eidx]


def broadcast_to_tokens(advantages: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Per-token advantages [B,T]: A[b] * loss_mask[b,t]; an input already [B,T] is masked."""
    adv = advantages.astype(jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    return adv * loss_mask.astype(jnp.float32)
