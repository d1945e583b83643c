"""KL estimators against a frozen reference policy, and the entropy of the policy.

With d = logp - ref_logp per token (samples drawn from the policy):

* ``k1`` (alias ``kl``):        d
* ``abs``:                      |d|
* ``k2`` (alias ``mse``):       d^2 / 2
* ``k3`` (alias ``low_var_kl``): exp(-d) - (-d) - 1 = exp(r) - r - 1 with r = -d
                                clamped to [-20, 20], the result clamped to [-10, 10]

Used as a loss term ``kl_coef * aggregate(kl(logp, ref_logp))`` when ``algo.kl_coef > 0``.
Select by name with :func:`get_kl_fn` (config ``algo.kl_estimator``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from verltool_jax.algos.registry import Registry

KL_EXP_CLAMP = 20.0
K3_CLAMP = 10.0

KLFn = Callable[[jax.Array, jax.Array], jax.Array]
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator", "algo.kl_estimator")


@KL_ESTIMATORS.register("k1", "kl")
def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k1 = logp - ref_logp (unbiased, high variance, can be negative)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("abs")
def kl_abs(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """|logp - ref_logp|."""
    return jnp.abs(logp - ref_logp)


@KL_ESTIMATORS.register("k2", "mse")
def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k2 = (logp - ref_logp)^2 / 2."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3", "low_var_kl")
def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k3 = exp(r) - r - 1, r = clamp(ref_logp - logp, -20, 20); result clamped to [-10, 10]."""
    r = jnp.clip(ref_logp - logp, -KL_EXP_CLAMP, KL_EXP_CLAMP)
    return jnp.clip(jnp.exp(r) - r - 1.0, -K3_CLAMP, K3_CLAMP)


def get_kl_fn(name: str) -> KLFn:
    """The estimator registered as ``name`` (k1 | k2 | k3 | abs and aliases)."""
    return KL_ESTIMATORS.get(name)


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Entropy per position H = logsumexp(z) - sum softmax(z) * z, float32 [..]."""
    z = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(z, axis=-1)
    return lse - (jax.nn.softmax(z, axis=-1) * z).sum(-1)
