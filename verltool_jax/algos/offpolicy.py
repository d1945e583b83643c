"""Off-policy corrections between the sampler and the trainer: importance weights at token,
sequence or geometric-mean level, truncated at a cap; masking of tokens or sequences whose
ratio leaves a band (masked IS, IcePop); and the per-step mismatch metrics.

Notation, per row b and target position t with loss mask ``m``: ``old`` the trainer's
behaviour logprob (recomputed before the update, ``algo.old_logprobs="recompute"``),
``s`` the sampler's, and the token log-ratio ``d_t = clamp(old_t - s_t, -20, 20)``
(``rho_t = exp(d_t) = p_trainer / p_sampler``). With ``n_b = sum_t m_t``, the ratio of a
*level* is, broadcast over the row's tokens:

* ``token``:      ``log r_{b,t} = d_t``;
* ``sequence``:   ``log r_b = sum_t m_t d_t``  (the product of the token ratios:
  the unbiased sequence IS weight, of high variance on long sequences);
* ``geometric``:  ``log r_b = sum_t m_t d_t / max(n_b, 1)``  (the geometric mean of the
  token ratios: length-normalised, biased, but of low variance; the quantity GSPO
  clips, here used as a correction against the sampler).

Both log forms are clamped to [-20, 20] before ``exp``. Then

* truncated IS (``algo.tis_cap = C``): ``w = min(r, C)`` (TIS, Yao et al., "Your
  efficient RL framework secretly brings you off-policy RL training", 2025,
  https://fengyao.notion.site/off-policy-rl; verl ``rollout_corr`` "token" /
  "sequence" IS modes, truncated at ``rollout_is_threshold``);
* masked IS (``algo.is_mask = level``, band ``[lo, hi]`` = ``algo.is_mask_low``,
  ``algo.is_mask_high``): ``keep = lo <= r <= hi`` at that level; a token or a whole
  sequence outside the band gets weight 0 (verl ``rollout_corr`` rejection sampling,
  ``rollout_rs`` "token" / "sequence" / "geometric"). Compared in log space
  (``log lo <= log r <= log hi``), so a sequence product never overflows.
* IcePop (Ant Group's Ring team, "Small Leak Can Sink a Great Ship -- Boost RL Training
  on MoE with IcePop!", 2025, https://ringtech.notion.site/icepop): each token's loss
  is multiplied by ``M(rho_t) = rho_t if alpha <= rho_t <= beta else 0`` with
  ``alpha=0.5, beta=5``: the token mask above with ``is_mask="token"``, band
  ``[0.5, 5]`` and ``tis_cap >= 5`` (so that ``w = rho`` inside the band). It is a
  setting combination, not a separate code path.

The final per-token weight is ``w * keep`` (no gradient), multiplied into the policy
loss per token; masked tokens still count in the loss normaliser (as in verl, where the
rejection mask multiplies the weights, and in IcePop, whose mask sits inside the
``1/|o|`` sum).

Where we differ from verl on purpose: verl's sequence and geometric levels are computed
from the *current* logprob against the sampler, with the trainer's ``old`` only in the
PPO ratio; here both ratios are taken at ``old`` (the behaviour policy the PPO ratio is
anchored on), as the existing token TIS does, so the weight is constant over the epochs
and mini-batches of one step. verl's veto threshold (drop a sequence if any token's
ratio is below a floor) is the ``token`` mask with ``hi = inf`` only per token; the
sequence veto is not offered.

Mismatch metrics (:func:`mismatch_metrics`), on the sampled tokens, with
``d = trainer - sampler`` log-probs of each token:

* ``offpolicy_kl_k3``: the k3 estimator of KL(sampler || trainer),
  ``mean_t (exp(d_t) - 1 - d_t)`` -- tokens are drawn from the sampler, so this is the
  unbiased, always non-negative estimator (Schulman, "Approximating KL divergence",
  2020, http://joschu.net/blog/kl-approx.html); verl's ``rollout_corr`` logs the k3
  form too (``rollout_corr/kl`` is k1, ``k3_kl`` k3); also the plain ``k1`` estimator
  ``mean(-d)`` (``offpolicy_kl_k1``);
* ``offpolicy_masked_frac``: the fraction of loss-mask tokens whose weight is 0;
* ``offpolicy_ratio_max``: the largest token ratio ``exp(d)``.

All functions are pure and jittable; every input is ``[B, T]`` float32 (mask 0/1).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from verltool_jax import metric_names as names
from verltool_jax.algos.aggregation import Normaliser, normaliser_for, token_mean
from verltool_jax.algos.policy_loss import LOG_RATIO_CLAMP, clamp

IS_LEVELS = ("token", "sequence", "geometric")
MASK_LEVELS = ("off",) + IS_LEVELS


@dataclass(frozen=True)
class OffPolicyConfig:
    """The correction of one train step (``algo.*`` fields of the same names).

    ``tis_cap``: None / 0 no truncated IS; ``tis_level`` the ratio it weighs by;
    ``is_mask`` ``"off"`` or the level of the band mask ``[is_mask_low, is_mask_high]``.
    """

    tis_cap: float | None = 2.0
    tis_level: str = "token"
    is_mask: str = "off"
    is_mask_low: float = 0.5
    is_mask_high: float = 5.0

    def __post_init__(self) -> None:
        if self.tis_cap is not None and self.tis_cap < 0:
            raise ValueError(f"algo.tis_cap must be > 0 (0 or None disables), got {self.tis_cap}")
        if self.tis_level not in IS_LEVELS:
            raise ValueError(f"algo.tis_level={self.tis_level!r} must be one of {list(IS_LEVELS)}")
        if self.is_mask not in MASK_LEVELS:
            raise ValueError(f"algo.is_mask={self.is_mask!r} must be one of {list(MASK_LEVELS)}")
        if not 0 < self.is_mask_low < self.is_mask_high:
            raise ValueError(
                "algo.is_mask_low and algo.is_mask_high must satisfy 0 < low < high "
                f"(a band around 1, e.g. 0.5 and 5), got {self.is_mask_low} and "
                f"{self.is_mask_high}"
            )

    @property
    def active(self) -> bool:
        """Whether any weight other than 1 can come out."""
        return bool(self.tis_cap) or self.is_mask != "off"


def log_ratio_at_level(
    old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, level: str
) -> jax.Array:
    """``log r`` [B,T] of ``level`` (module docstring), zero where ``mask`` is 0, clamped to
    [-20, 20]; no gradient."""
    m = mask.astype(jnp.float32)
    d = jnp.where(m > 0, old_logp - sampler_logp, 0.0)
    d = clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if level == "token":
        out = d
    elif level in ("sequence", "geometric"):
        total = d.sum(-1, keepdims=True)
        if level == "geometric":
            total = total / jnp.maximum(m.sum(-1, keepdims=True), 1.0)
        out = jnp.broadcast_to(clamp(total, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), d.shape) * m
    else:
        raise ValueError(f"unknown ratio level {level!r}; choose one of {list(IS_LEVELS)}")
    return jax.lax.stop_gradient(out)


def band_mask(log_ratio: jax.Array, low: float, high: float) -> jax.Array:
    """1.0 where ``low <= exp(log_ratio) <= high``, else 0.0 (compared in log space)."""
    lo, hi = jnp.log(jnp.float32(low)), jnp.log(jnp.float32(high))
    return ((log_ratio >= lo) & (log_ratio <= hi)).astype(jnp.float32)


def offpolicy_weights(
    old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, cfg: OffPolicyConfig
) -> jax.Array | None:
    """The per-token weight ``min(r_level, cap) * keep`` [B,T] (no gradient), or None when
    ``cfg`` corrects nothing. Without a cap the weight is ``keep`` alone (pure masking)."""
    if not cfg.active:
        return None
    m = mask.astype(jnp.float32)
    w = jnp.ones_like(m)
    if cfg.tis_cap:
        w = jnp.minimum(
            jnp.exp(log_ratio_at_level(old_logp, sampler_logp, m, cfg.tis_level)), cfg.tis_cap
        )
    if cfg.is_mask != "off":
        lr = log_ratio_at_level(old_logp, sampler_logp, m, cfg.is_mask)
        w = w * band_mask(lr, cfg.is_mask_low, cfg.is_mask_high)
    return jax.lax.stop_gradient(w)


def mismatch_metrics(
    trainer_logp: jax.Array,
    sampler_logp: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None = None,
    norm: Normaliser | None = None,
) -> dict[str, jax.Array]:
    """The sampler/trainer mismatch of the sampled tokens (module docstring): k3 and k1
    estimates of KL(sampler || trainer), the fraction of tokens with weight 0 (0 without
    ``weights``) and the largest token ratio. Token means with ``norm`` (default: this
    mask's), so micro-batch values add up to the mini-batch's."""
    m = mask.astype(jnp.float32)
    if norm is None:
        norm = normaliser_for(m)
    d = jax.lax.stop_gradient(
        clamp(jnp.where(m > 0, trainer_logp - sampler_logp, 0.0), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    )
    k3 = jnp.exp(d) - 1.0 - d
    masked = jnp.zeros_like(m) if weights is None else (weights <= 0).astype(jnp.float32)
    return {
        names.TRAIN_MISMATCH_KL_K3: token_mean(k3, m, norm),
        names.TRAIN_MISMATCH_KL_K1: token_mean(-d, m, norm),
        names.TRAIN_OFFPOLICY_MASKED_FRAC: token_mean(masked, m, norm),
        names.TRAIN_MISMATCH_RATIO_MAX: jnp.max(jnp.where(m > 0, jnp.exp(d), 0.0)),
    }
