"""Policy-gradient losses: PPO clipped ratio (clip-higher, dual clip), GSPO and CISPO.

Per token, with A the advantage (per sequence, broadcast over the response tokens),
logp the current policy's logprob and old the behaviour logprob:

* ``ppo`` (also ``grpo``/``vanilla``, DAPO clip-higher via separate eps; follows verl
  ``core_algos.compute_policy_loss_vanilla``, except that the dual clip can be turned off):
    ratio = exp(clamp(logp - old, -20, 20))
    l1 = -A * ratio,  l2 = -A * clip(ratio, 1 - eps_low, 1 + eps_high)
    l  = max(l1, l2)
    dual clip, for A < 0 only:  l = min(l, -A * c)   (c = ``dual_clip_c`` > 1; None = off)
* ``gspo`` (sequence-level ratio, GSPO-token form; follows verl
  ``core_algos.compute_policy_loss_gspo``):
    k_b = sum_t m*(logp - old) / max(n_b, 1)                (mean token log-ratio)
    log s_{b,t} = min(sg(k_b) + logp - sg(logp), 10)        (value k_b, gradient of logp;
                                                             no gradient where clamped)
    l = max(-A * s, -A * clip(s, 1 - eps_low, 1 + eps_high))   (no dual clip)
    always aggregated as ``seq-mean-token-mean``, whatever ``loss_agg_mode`` says
    (that mode still applies to the KL and entropy terms of the train step).
* ``cispo`` (clipped IS-weight policy optimisation, MiniMax-M1,
  https://arxiv.org/abs/2506.13585; follows verl ``core_algos.compute_policy_loss_cispo``):
    ratio = exp(clamp(logp - old, -20, 20))
    l = -sg(clip(ratio, 1 - eps_low, 1 + eps_high)) * A * logp
    the weight is clipped, never the token: every token keeps the gradient
    -clip(ratio) * A * grad(logp) (PPO zeroes it once clipped); no dual clip;
    ``pg_clipfrac`` is the fraction of tokens whose ratio lies outside the bounds.
    The paper and verl's recipe set no lower bound (``clip_ratio_low`` >= 1, verl's
    example uses 10) and tune only eps_high. Its ``pg_loss`` value carries logp, so it
    is not comparable with the ratio losses' values; its gradient is.

Truncated importance weight (off-policy data from an asynchronous sampler): when
``is_weights`` is given (see :func:`truncated_is_weights`) each token's loss is
multiplied by it (no gradient through the weight).

The token losses are aggregated by :func:`verltool_jax.algos.aggregation.aggregate`.
Each loss returns ``(loss, metrics)``; metric values are additive over micro-batches
(token means with the mini-batch :class:`Normaliser`), except keys ending in ``_max``
/ ``_min`` which combine by max / min. Metrics: ``pg_loss``, ``pg_clipfrac`` (the clip
bound is active), ``pg_clipfrac_lower`` (dual clip active), ``ppo_kl`` (mean of
old - logp), ``ratio_mean``, ``ratio_max``, ``ratio_min``.
Select by name with :func:`get_policy_loss` (config ``algo.policy_loss``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp

from verltool_jax import metric_names as names
from verltool_jax.algos.aggregation import (
    Normaliser,
    aggregate,
    check_agg_mode,
    normaliser_for,
    token_mean,
)
from verltool_jax.algos.registry import Registry

LOG_RATIO_CLAMP = 20.0  # |log ratio| bound of the PPO loss and the IS weight (verl)
GSPO_LOG_RATIO_MAX = 10.0  # upper bound of GSPO's sequence log-ratio (verl)
GSPO_AGG_MODE = "seq-mean-token-mean"


@dataclass(frozen=True)
class PolicyLossConfig:
    """Knobs of the policy losses (``algo.*`` config fields of the same names)."""

    clip_ratio_low: float = 0.2  # lower bound 1 - low; >= 1: none (CISPO)
    clip_ratio_high: float = 0.2  # DAPO clip-higher: e.g. 0.28
    dual_clip_c: float | None = 3.0  # None or 0 disables the dual clip
    loss_agg_mode: str = "token-mean"
    loss_norm_constant: float | None = None  # C of seq-mean-token-sum-norm (default T)

    def __post_init__(self):
        if not self.clip_ratio_low >= 0.0:
            raise ValueError(
                f"algo.clip_ratio_low must be >= 0 (>= 1: no lower bound), "
                f"got {self.clip_ratio_low}"
            )
        if self.clip_ratio_high < 0.0:
            raise ValueError(f"algo.clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.dual_clip_c and self.dual_clip_c <= 1.0:
            raise ValueError(
                f"algo.dual_clip_c must be > 1 (or None to disable), got {self.dual_clip_c}"
            )
        if self.loss_norm_constant is not None and self.loss_norm_constant <= 0:
            raise ValueError(
                f"algo.loss_norm_constant must be > 0 or None, got {self.loss_norm_constant}"
            )
        check_agg_mode(self.loss_agg_mode)


LossOut = tuple[jax.Array, dict[str, jax.Array]]
PolicyLossFn = Callable[..., LossOut]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "algo.policy_loss")


def clamp(x: jax.Array, low: float = -jnp.inf, high: float = jnp.inf) -> jax.Array:
    """min(max(x, low), high) with torch.clamp's gradient: 1 where low <= x <= high, else 0
    (``jnp.clip`` halves it at the bounds), so gradients match verl's everywhere."""
    return jnp.where(x < low, low, jnp.where(x > high, high, x))


def truncated_is_weights(old_logp: jax.Array, sampler_logp: jax.Array, cap: float) -> jax.Array:
    """Truncated importance weight w = min(exp(clamp(old - sampler, -20, 20)), cap), no gradient.

    Corrects for the sampler (e.g. vLLM, possibly some versions stale) differing from the
    trainer's behaviour policy ``old``.
    """
    if cap <= 0:
        raise ValueError(f"algo.tis_cap must be > 0 (or None to disable), got {cap}")
    d = clamp(old_logp - sampler_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jax.lax.stop_gradient(jnp.minimum(jnp.exp(d), cap))


def _clipped_objective(ratio, adv, cfg: PolicyLossConfig):
    """max(-A r, -A clip(r)) and the dual clip; returns (loss, clipped?, dual-clipped?)."""
    l1 = -adv * ratio
    l2 = -adv * clamp(ratio, 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    loss = jnp.maximum(l1, l2)
    clipped = (l2 > l1).astype(jnp.float32)
    if cfg.dual_clip_c:
        l3 = -adv * cfg.dual_clip_c
        dual = jnp.minimum(loss, l3)
        lower = ((adv < 0) & (loss > l3)).astype(jnp.float32)
        loss = jnp.where(adv < 0, dual, loss)
    else:
        lower = jnp.zeros_like(loss)
    return loss, clipped, lower


def _finish(
    loss_tok,
    ratio,
    log_ratio,
    clipped,
    lower,
    mask,
    cfg,
    norm,
    is_weights,
    agg_mode: str | None = None,
) -> LossOut:
    m = mask.astype(jnp.float32)
    if norm is None:
        norm = normaliser_for(m)
    if is_weights is not None:
        loss_tok = loss_tok * is_weights
    loss = aggregate(loss_tok, m, agg_mode or cfg.loss_agg_mode, norm, cfg.loss_norm_constant)
    valid = m > 0
    metrics = {
        "pg_loss": loss,
        "pg_clipfrac": token_mean(clipped, m, norm),
        "pg_clipfrac_lower": token_mean(lower, m, norm),
        "ppo_kl": token_mean(-log_ratio, m, norm),
        "ratio_mean": token_mean(ratio, m, norm),
        "ratio_max": jnp.max(jnp.where(valid, ratio, 0.0)),
        "ratio_min": jnp.min(jnp.where(valid, ratio, jnp.inf)),
    }
    if is_weights is not None:
        metrics[names.TRAIN_TIS_WEIGHT_MEAN] = token_mean(is_weights, m, norm)
    return loss, metrics


@POLICY_LOSSES.register("ppo", "grpo", "vanilla", "dapo")
def ppo_clip_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    cfg: PolicyLossConfig = PolicyLossConfig(),
    norm: Normaliser | None = None,
    is_weights: jax.Array | None = None,
) -> LossOut:
    """PPO clipped-ratio loss with low/high clip and dual clip (module docstring).

    Shapes: ``logp, old_logp, mask, is_weights`` [B,T]; ``advantages`` [B] or [B,T].
    """
    adv = advantages.astype(jnp.float32)
    if adv.ndim == 1:
        adv = jnp.broadcast_to(adv[:, None], logp.shape)
    log_ratio = clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    loss_tok, clipped, lower = _clipped_objective(ratio, adv, cfg)
    return _finish(loss_tok, ratio, log_ratio, clipped, lower, mask, cfg, norm, is_weights)


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    cfg: PolicyLossConfig = PolicyLossConfig(dual_clip_c=None),
    norm: Normaliser | None = None,
    is_weights: jax.Array | None = None,
) -> LossOut:
    """GSPO: sequence-level (length-normalised) ratio, clipped per sequence (module docstring).

    Follows verl ``core_algos.compute_policy_loss_gspo``: the sequence log-ratio is
    clamped at most 10 (no lower bound: its exp cannot overflow) with zero gradient where
    the clamp is active, there is no dual clip, and the token losses are aggregated as
    ``seq-mean-token-mean`` regardless of ``cfg.loss_agg_mode``. Metrics as verl:
    ``pg_clipfrac_lower`` is 0 and ``ppo_kl`` is the token mean of old - logp.
    Shapes as :func:`ppo_clip_loss`.
    """
    m = mask.astype(jnp.float32)
    adv = advantages.astype(jnp.float32)
    if adv.ndim == 1:
        adv = jnp.broadcast_to(adv[:, None], logp.shape)
    token_log_ratio = jnp.where(m > 0, logp - old_logp, 0.0)
    seq_log_ratio = token_log_ratio.sum(-1) / jnp.maximum(m.sum(-1), 1.0)
    log_s = jax.lax.stop_gradient(seq_log_ratio)[:, None] + logp - jax.lax.stop_gradient(logp)
    log_s = clamp(log_s, high=GSPO_LOG_RATIO_MAX)
    ratio = jnp.exp(log_s)
    loss_tok, clipped, lower = _clipped_objective(ratio, adv, replace(cfg, dual_clip_c=None))
    return _finish(
        loss_tok,
        ratio,
        token_log_ratio,
        clipped,
        lower,
        mask,
        cfg,
        norm,
        is_weights,
        agg_mode=GSPO_AGG_MODE,
    )


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    cfg: PolicyLossConfig = PolicyLossConfig(clip_ratio_low=10.0, dual_clip_c=None),
    norm: Normaliser | None = None,
    is_weights: jax.Array | None = None,
) -> LossOut:
    """CISPO: l = -sg(clip(ratio, 1 - eps_low, 1 + eps_high)) * A * logp (module docstring).

    Follows verl ``core_algos.compute_policy_loss_cispo`` (MiniMax-M1,
    https://arxiv.org/abs/2506.13585): aggregated by ``cfg.loss_agg_mode``, the dual clip
    is never applied, ``pg_clipfrac_lower`` is 0. Shapes as :func:`ppo_clip_loss`.
    """
    adv = advantages.astype(jnp.float32)
    if adv.ndim == 1:
        adv = jnp.broadcast_to(adv[:, None], logp.shape)
    log_ratio = clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    low, high = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high
    weight = jax.lax.stop_gradient(clamp(ratio, low, high))
    loss_tok = -weight * adv * logp
    clipped = ((ratio < low) | (ratio > high)).astype(jnp.float32)
    lower = jnp.zeros_like(loss_tok)
    return _finish(loss_tok, ratio, log_ratio, clipped, lower, mask, cfg, norm, is_weights)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The loss registered as ``name`` (``POLICY_LOSSES.names()`` lists them)."""
    return POLICY_LOSSES.get(name)
