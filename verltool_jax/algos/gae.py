"""PPO with a learned critic: GAE advantages, returns and the clipped value loss.

Selected by ``algo.adv_estimator = "gae"`` (:data:`GAE`). Arrays are target-aligned
``[B,T]`` (``train.batch``): position t is the state after tokens ``0..t`` in which the
policy draws token t+1; ``mask[b,t] = 1`` iff that token was sampled by the policy.
``values[b,t]`` is the critic's estimate V(s_t) at the same position.

Rewards (:func:`outcome_token_rewards`): the sequence's outcome reward r_b on its last
*sampled* token, 0 elsewhere. verl puts it on the last response token
(``valid_response_length - 1``), which in a multi-turn trajectory may be an observation
token (a tool's output, a tag closed on the model's behalf); verl's recursion skips
those, so its reward would be lost there. Ours always lands on a token the model drew.

GAE (:func:`gae_advantages_returns`; Schulman et al. 2016, https://arxiv.org/abs/1506.02438),
following verl ``core_algos.compute_gae_advantage_return``. Over the sampled tokens only,
t' being the next sampled position after t (none: V = 0, the episode ends):

    delta_t = r_t + gamma * V(s_t') - V(s_t)
    A_t     = delta_t + gamma * lambda * A_t'
    R_t     = A_t + V(s_t)                      (the critic's regression target)

The observation tokens between turns are not steps of the policy: the recursion carries
``V(s_t')`` and ``A_t'`` across them unchanged (verl's multi-turn form: ``nextvalues`` and
``lastgaelam`` are updated only where ``response_mask`` is 1), so gamma and lambda count
the model's own tokens. Older verl ran the recursion over every response token,
observations included; we do not. Outputs are 0 outside the mask (verl leaves the
carried values there; the losses mask them out either way). With gamma = lambda = 1 and
an outcome reward, A_t = r_b - V(s_t) and R_t = r_b (the reward-to-go); with lambda = 0,
A_t is the one-step TD error.

The advantages are then whitened over the batch's sampled tokens (:func:`masked_whiten`,
verl ``masked_whiten``: shift the mean, divide by the unbiased std; verl whitens inside
``compute_gae_advantage_return``).

Value loss (:func:`value_loss`), following verl ``core_algos.compute_value_loss``
(``cliprange_value``, our ``algo.value_clip``):

    V_clip = V_old + clip(V - V_old, -c, c)
    L      = 0.5 * agg(max((V - R)^2, (V_clip - R)^2))

aggregated by ``algo.loss_agg_mode`` like the policy loss; ``vf_clipfrac`` is the token
fraction where the clipped error is the larger. ``c = 0`` (or None) turns the clip off:
L = 0.5 * agg((V - R)^2) (verl always clips).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from verltool_jax.algos.aggregation import Normaliser, aggregate, token_mean

GAE = "gae"  # the algo.adv_estimator name of PPO with a critic
WHITEN_EPS = 1e-8  # verl masked_whiten: (x - mean) * rsqrt(var + 1e-8)
EXPLAINED_VAR_EPS = 1e-5  # verl: 1 - var(R - V) / (var(R) + 1e-5)


def _check_same_shape(**arrays: jax.Array) -> None:
    shapes = {k: tuple(jnp.shape(v)) for k, v in arrays.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"expected [B,T] arrays of one shape, got {shapes}")


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """Token rewards [B,T] float32: ``rewards[b]`` at row b's last position with
    ``mask > 0`` (its last sampled token), 0 elsewhere; a row without one is all 0."""
    m = mask > 0
    if jnp.ndim(rewards) != 1 or jnp.shape(rewards)[0] != m.shape[0]:
        raise ValueError(
            f"rewards must be [B] with B = mask rows ({m.shape[0]}), got {jnp.shape(rewards)}"
        )
    T = m.shape[1]
    last = T - 1 - jnp.argmax(m[:, ::-1], axis=1)
    onehot = (jnp.arange(T)[None, :] == last[:, None]) & m.any(axis=1, keepdims=True)
    return jnp.where(onehot, rewards.astype(jnp.float32)[:, None], 0.0)


def gae_advantages_returns(
    token_rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """``(advantages, returns)`` [B,T] float32 by GAE over the sampled tokens (module
    docstring; verl ``compute_gae_advantage_return`` before its whitening).

    ``token_rewards``, ``values``, ``mask`` [B,T]; positions with mask 0 are skipped by
    the recursion and are 0 in both outputs. Not whitened (:func:`masked_whiten`)."""
    _check_same_shape(token_rewards=token_rewards, values=values, mask=mask)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"GAE needs gamma and lambda in [0, 1], got gamma={gamma}, lam={lam}")
    r = token_rewards.astype(jnp.float32).T  # [T,B]: scan over time
    v = values.astype(jnp.float32).T
    m = (mask > 0).astype(jnp.float32).T

    def back(carry, x):
        next_value, next_adv = carry
        r_t, v_t, m_t = x
        adv = r_t + gamma * next_value - v_t + gamma * lam * next_adv
        next_value = m_t * v_t + (1.0 - m_t) * next_value
        next_adv = m_t * adv + (1.0 - m_t) * next_adv
        return (next_value, next_adv), next_adv

    zero = jnp.zeros(r.shape[1], jnp.float32)
    _, adv = jax.lax.scan(back, (zero, zero), (r, v, m), reverse=True)
    adv = adv.T * mask.astype(jnp.float32)
    returns = (adv + values.astype(jnp.float32)) * mask.astype(jnp.float32)
    return adv, returns


def masked_whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """(x - mu) / sqrt(var + 1e-8) over the positions with mask > 0, 0 elsewhere;
    mu the masked mean, var the unbiased masked variance (verl ``masked_whiten``).
    Fewer than 2 masked positions: all 0 (no variance; verl divides by zero)."""
    m = (mask > 0).astype(jnp.float32)
    n = m.sum()
    mu = (x * m).sum() / jnp.maximum(n, 1.0)
    var = (m * (x - mu) ** 2).sum() / jnp.maximum(n - 1.0, 1.0)
    return jnp.where((n >= 2.0) & (m > 0), (x - mu) * jax.lax.rsqrt(var + WHITEN_EPS), 0.0)


def explained_variance(returns: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - var(R - V) / (var(R) + 1e-5) over the masked tokens (verl's
    ``critic/vf_explained_var``; population variances). 1: the critic predicts the
    returns; 0: no better than their mean; < 0: worse."""
    m = (mask > 0).astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)

    def var(x):
        mu = (x * m).sum() / n
        return (m * (x - mu) ** 2).sum() / n

    return 1.0 - var(returns - values) / (var(returns) + EXPLAINED_VAR_EPS)


def value_loss(
    vpreds: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    clip: float | None,
    agg_mode: str = "token-mean",
    norm: Normaliser | None = None,
    norm_constant: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped value loss and its metrics (module docstring; verl ``compute_value_loss``).

    ``vpreds`` the critic's current values, ``old_values`` those before the update (the
    ones GAE used), ``returns`` the targets, all [B,T]; ``clip`` = c (0/None: no clip);
    ``norm`` the counts of the whole mini-batch (``aggregation``), so micro-batch losses
    add up. Returns ``(loss, {"vf_loss", "vf_clipfrac"})``."""
    _check_same_shape(vpreds=vpreds, old_values=old_values, returns=returns, mask=mask)
    v = vpreds.astype(jnp.float32)
    err = (v - returns) ** 2
    if clip:
        old = old_values.astype(jnp.float32)
        clipped = old + jnp.clip(v - old, -clip, clip)
        err_clipped = (clipped - returns) ** 2
        loss_mat = jnp.maximum(err, err_clipped)
        frac = token_mean((err_clipped > err).astype(jnp.float32), mask, norm)
    else:
        loss_mat, frac = err, jnp.zeros((), jnp.float32)
    loss = 0.5 * aggregate(loss_mat, mask, agg_mode, norm, norm_constant)
    return loss, {"vf_loss": loss, "vf_clipfrac": frac}
