"""Per-token log-probabilities without materialising the full ``[B, T, V]`` logits.

With vocabularies of ~150k the logits dominate memory (B*T*V floats, and as many again
for their gradient). ``chunked_logprobs`` computes them ``chunk_size`` positions at a
time inside ``lax.map`` and rematerialises each chunk in the backward pass, so the peak
is ``B * chunk_size * V`` instead of ``B * T * V``.
"""
from __future__ import annotations

from functools import partial
from typing import Union

import jax
import jax.numpy as jnp

Temperature = Union[float, jnp.ndarray]


def _check_temperature(temperature) -> None:
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0 (logits are divided by it), got {temperature}")


def _chunk_stats(h, w, tgt, temperature, with_entropy):
    """One chunk: ``z = (h @ w) / T``; ``logp = z[tgt] - logsumexp(z)``;
    ``entropy = logsumexp(z) - sum(softmax(z) * z)``."""
    z = jnp.einsum("bch,hv->bcv", h, w.astype(h.dtype), preferred_element_type=jnp.float32)
    z = z / jnp.asarray(temperature, jnp.float32)
    lse = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, tgt[..., None], axis=-1)[..., 0] - lse
    if not with_entropy:
        return logp, jnp.zeros_like(logp)
    ent = lse - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
    return logp, ent


def chunked_logprobs(hidden: jnp.ndarray, weight: jnp.ndarray, targets: jnp.ndarray,
                     temperature: Temperature = 1.0, chunk_size: int = 256,
                     return_entropy: bool = False):
    """``log softmax(hidden @ weight / T)[targets]`` per position, ``chunk_size`` positions at a time.

    ``hidden [B,T,H]``, ``weight [H,V]``, ``targets [B,T]`` int -> ``[B,T]`` float32 (and the
    entropy ``-sum p log p`` of the same distribution when ``return_entropy``). Each chunk is
    rematerialised in the backward pass (``jax.checkpoint``).
    """
    _check_temperature(temperature)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    B, T, H = hidden.shape
    if targets.shape != (B, T):
        raise ValueError(f"targets shape {targets.shape} must be hidden's [B, T] = {(B, T)}")
    c = min(chunk_size, T)
    n = -(-T // c)
    pad = n * c - T
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(B, n, c, H).transpose(1, 0, 2, 3)
    t = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, pad))).reshape(B, n, c).transpose(1, 0, 2)
    fn = jax.checkpoint(partial(_chunk_stats, with_entropy=return_entropy))
    logp, ent = jax.lax.map(lambda xs: fn(xs[0], weight, xs[1], temperature), (h, t))
    logp = logp.transpose(1, 0, 2).reshape(B, n * c)[:, :T]
    if not return_entropy:
        return logp
    return logp, ent.transpose(1, 0, 2).reshape(B, n * c)[:, :T]


def token_logprobs(model, input_ids: jnp.ndarray, attention_mask: jnp.ndarray,
                   targets: jnp.ndarray, temperature: Temperature = 1.0, chunk_size: int = 256,
                   return_entropy: bool = False, positions=None, images=None, row_images=None):
    """``log softmax(model(input_ids)/T)[targets]`` -> ``[B,T]`` float32, chunked over the sequence.

    ``targets[b, t]`` is the token whose probability position t predicts (usually
    ``input_ids[b, t+1]``); the caller masks positions that are not scored. With
    ``return_entropy=True`` returns ``(logprobs, entropy)``. A vision-language model takes
    ``positions`` and ``images`` from ``vision_language.vl_inputs`` (or ``row_images``, the
    train batch's per-row layout).
    """
    kw = {"row_images": row_images} if row_images is not None else {}
    hidden = model.hidden_states(input_ids, attention_mask, positions, images=images, **kw)
    return chunked_logprobs(hidden, model.lm_head_weight(), targets, temperature, chunk_size,
                            return_entropy)


def naive_logprobs(logits: jnp.ndarray, targets: jnp.ndarray, temperature: Temperature = 1.0):
    """Reference: full ``log_softmax(logits / T)`` gathered at ``targets`` (materialises [B,T,V])."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    return jnp.take_along_axis(lp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
