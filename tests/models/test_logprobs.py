"""Chunked token log-probabilities: equal to the naive full-logits ones, at a fraction of the memory."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support.models import padded_batch, tiny_ckpt

from verltool_jax.models.hf_io import load_hf
from verltool_jax.models.logprobs import (
    KEEP_LOGITS_BYTES,
    chunked_logprobs,
    naive_logprobs,
    token_logprobs,
)


@pytest.fixture(scope="module")
def model():
    return load_hf(tiny_ckpt("qwen2"))


@pytest.mark.parametrize("chunk", [5, 64])  # 5 does not divide T = 12; 64 > T
def test_token_logprobs_equal_naive_with_temperature_and_entropy(model, chunk):
    ids, mask = map(jnp.asarray, padded_batch(seed=4))
    targets = jnp.roll(ids, -1, axis=1)
    T = 0.7

    @nnx.jit
    def both(m):
        lp, ent = token_logprobs(
            m, ids, mask, targets, temperature=T, chunk_size=chunk, return_entropy=True
        )
        logits = m(ids, mask)
        p = jax.nn.softmax(logits / T, -1)
        ref_ent = -(p * jax.nn.log_softmax(logits / T, -1)).sum(-1)
        return lp, ent, naive_logprobs(logits, targets, T), ref_ent, naive_logprobs(logits, targets)

    lp, ent, ref, ref_ent, ref_t1 = both(model)
    assert lp.shape == ids.shape and lp.dtype == jnp.float32
    np.testing.assert_allclose(lp, ref, atol=2e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=2e-5)
    assert np.abs(np.asarray(ref) - np.asarray(ref_t1)).max() > 1e-2  # temperature matters


def test_gradient_equals_naive(model):
    ids, mask = map(jnp.asarray, padded_batch(seed=5))
    targets = jnp.roll(ids, -1, axis=1)
    graphdef, params = nnx.split(model, nnx.Param)

    @jax.jit
    def grads(p):
        def chunked(p):
            return (token_logprobs(nnx.merge(graphdef, p), ids, mask, targets, 1.3, 4) * mask).sum()

        def naive(p):
            logits = nnx.merge(graphdef, p)(ids, mask)
            return (naive_logprobs(logits, targets, 1.3) * mask).sum()

        return jax.grad(chunked)(p), jax.grad(naive)(p)

    g1, g2 = grads(params)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("keep_logits_bytes", [0, KEEP_LOGITS_BYTES])
def test_gradient_through_logprobs_and_entropy_equals_autodiff_of_full_logits(keep_logits_bytes):
    """The chunks' hand-written backward pass (``_chunk_stats_bwd``), with the logits
    recomputed (a budget of 0) and kept from the forward pass: both cotangents at once (a
    loss mixing log-probabilities and entropy, as an entropy bonus does), a temperature,
    a chunk that does not divide T, and a bfloat16 hidden state."""
    rng = np.random.default_rng(0)
    B, T, H, V = 2, 7, 8, 32
    h = jnp.asarray(rng.standard_normal((B, T, H)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((H, V)) * 0.5, jnp.float32)
    t = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    a = jnp.asarray(rng.standard_normal((B, T)), jnp.float32)

    def chunked(h, w):
        lp, ent = chunked_logprobs(
            h, w, t, 0.8, chunk_size=3, return_entropy=True, keep_logits_bytes=keep_logits_bytes
        )
        return (a * lp).sum() + (0.3 * ent).sum()

    def full(h, w):
        z = jnp.einsum("bth,hv->btv", h.astype(jnp.float32), w) / 0.8
        logp = jax.nn.log_softmax(z, -1)
        ent = -(jnp.exp(logp) * logp).sum(-1)
        return (a * jnp.take_along_axis(logp, t[..., None], -1)[..., 0]).sum() + (0.3 * ent).sum()

    got = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1)))(h, w)
    want = jax.jit(jax.value_and_grad(full, argnums=(0, 1)))(h, w)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(x, y, atol=2e-5, rtol=1e-5)
    dh, dw = jax.grad(chunked, argnums=(0, 1))(h.astype(jnp.bfloat16), w)
    assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(dh, np.float32), want[1][0], atol=0.05, rtol=0.05)
    np.testing.assert_allclose(dw, want[1][1], atol=0.1, rtol=0.05)


def test_chunked_peak_memory_is_below_naive():
    B, T, H, V = 2, 512, 64, 16384
    h = jax.ShapeDtypeStruct((B, T, H), jnp.float32)
    w = jax.ShapeDtypeStruct((H, V), jnp.float32)
    t = jax.ShapeDtypeStruct((B, T), jnp.int32)

    def loss_chunked(h, w, t, keep=0):
        return chunked_logprobs(h, w, t, 1.0, chunk_size=64, keep_logits_bytes=keep).sum()

    def loss_naive(h, w, t):
        return naive_logprobs(jnp.einsum("bth,hv->btv", h, w), t).sum()

    def temp_bytes(f):
        c = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(h, w, t).compile()
        return c.memory_analysis().temp_size_in_bytes

    full = B * T * V * 4
    chunked, naive = temp_bytes(loss_chunked), temp_bytes(loss_naive)
    assert naive >= full  # the naive one holds the [B,T,V] logits
    # the chunked one holds a few [B, 64, V] chunks and the [H, V] gradient, never [B,T,V]
    assert chunked < full / 2
    assert chunked < naive / 10
    # within the budget the logits are kept for the backward (one matmul fewer), above it
    # recomputed: the budget is what decides
    kept = temp_bytes(partial(loss_chunked, keep=full))
    assert kept >= full and temp_bytes(partial(loss_chunked, keep=full - 1)) == chunked


def test_bad_arguments_are_named():
    h = jnp.zeros((1, 3, 4))
    w = jnp.zeros((4, 8))
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs(h, w, jnp.zeros((1, 3), jnp.int32), temperature=0.0)
    with pytest.raises(ValueError, match="targets"):
        chunked_logprobs(h, w, jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs(h, w, jnp.zeros((1, 3), jnp.int32), chunk_size=0)
