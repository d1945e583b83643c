"""Top-k / top-p truncation of a distribution, shared by the JAX sampler (which draws from
it) and the trainer (which scores the drawn tokens under the same truncation,
``models.logprobs.truncated_logprobs``). ``TOP_P_OFF`` / ``TOP_K_OFF`` are the settings
that truncate nothing: the defaults of ``SamplingParams``, ``rollout.top_p/top_k`` and
``algo.top_p/top_k``. A leaf: jax is imported only by the function that needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax.numpy as jnp

TOP_P_OFF = 1.0
TOP_K_OFF = -1


def truncation_active(top_k: int, top_p: float) -> bool:
    """Whether ``(top_k, top_p)`` truncates (``top_k > 0`` or ``top_p < 1``)."""
    return top_k > 0 or top_p < TOP_P_OFF


def truncate_logits(z: jnp.ndarray, top_k: jnp.ndarray, top_p: jnp.ndarray) -> jnp.ndarray:
    """Set everything outside each row's top-k / top-p set to ``-inf``.

    ``z [B,V]`` (already divided by T), ``top_k [B]`` int (<= 0: off), ``top_p [B]`` in (0,1].
    """
    import jax  # here, so that the settings above import without jax
    import jax.numpy as jnp

    V = z.shape[-1]
    srt = -jnp.sort(-z, axis=-1)  # descending
    k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)
    rank = jnp.arange(V)[None, :]
    in_k = rank < k[:, None]
    p_sorted = jax.nn.softmax(jnp.where(in_k, srt, -jnp.inf), axis=-1)
    before = jnp.cumsum(p_sorted, axis=-1) - p_sorted  # mass strictly above
    keep = in_k & (before < top_p[:, None])
    n_keep = jnp.maximum(keep.sum(axis=-1), 1)
    thresh = jnp.take_along_axis(srt, (n_keep - 1)[:, None], axis=-1)
    return jnp.where(z >= thresh, z, -jnp.inf)
