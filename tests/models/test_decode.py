"""KV-cache decoding equals the full forward, for a batch of prompts of different lengths."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support.models import hf_logits, hf_model, padded_batch, tiny_ckpt

from verltool_jax.models.decode import decode_step, init_cache, prefill
from verltool_jax.models.hf_io import load_hf

STEPS = 6


@pytest.mark.parametrize("family,tie", [("qwen2", True), ("llama", False)])
def test_greedy_cached_decode_matches_full_forward(family, tie):
    model = load_hf(tiny_ckpt(family, tie))
    ids, mask = padded_batch(seed=6)  # rows 0,1 left-padded, rows 2,3 right-padded
    B, T = ids.shape
    jprefill = nnx.jit(prefill)
    jstep = nnx.jit(decode_step)
    hf = hf_model(tiny_ckpt(family, tie))

    cache = init_cache(model.config, B, T + STEPS)
    cache, logits = jprefill(model, cache, jnp.asarray(ids), jnp.asarray(mask))
    seqs = [list(ids[b][mask[b] == 1]) for b in range(B)]
    for _step in range(STEPS):
        # reference: each row's real tokens so far, right-padded into one batch, full
        # forward in transformers (PyTorch)
        L = max(len(s) for s in seqs)
        ref_ids = np.zeros((B, L), np.int64)
        ref_mask = np.zeros((B, L), np.int64)
        for b, s in enumerate(seqs):
            ref_ids[b, : len(s)] = s
            ref_mask[b, : len(s)] = 1
        ref = hf_logits(hf, ref_ids, ref_mask)
        ref_last = ref[np.arange(B), ref_mask.sum(1) - 1]
        np.testing.assert_allclose(np.asarray(logits), ref_last, atol=1e-4)
        nxt = np.asarray(jnp.argmax(logits, -1))
        np.testing.assert_array_equal(nxt, ref_last.argmax(-1))
        for b in range(B):
            seqs[b].append(int(nxt[b]))
        cache, logits = jstep(model, cache, jnp.asarray(nxt))
    assert int(cache.index) == T + STEPS
    np.testing.assert_array_equal(np.asarray(cache.positions), mask.sum(1) + STEPS)


@pytest.mark.parametrize("chunk", [1, 5, 7])
def test_chunked_prefill_equals_one_pass(chunk):
    """A prompt block run ``chunk`` tokens at a time (the last chunk shorter, left- and
    right-padded rows, a chunk of pure padding for the short left-padded row) leaves the
    same cache and the same last logits as one pass over the block."""
    model = load_hf(tiny_ckpt("llama", False))
    ids, mask = padded_batch(seed=6)
    B, T = ids.shape
    assert T > chunk and (chunk == 1 or T % chunk)  # several chunks, a partial last one
    run = nnx.jit(prefill, static_argnames="chunk")
    c_one, l_one = run(
        model, init_cache(model.config, B, T + 2), jnp.asarray(ids), jnp.asarray(mask), chunk=T
    )
    c_chk, l_chk = run(
        model, init_cache(model.config, B, T + 2), jnp.asarray(ids), jnp.asarray(mask), chunk=chunk
    )
    np.testing.assert_allclose(np.asarray(l_chk), np.asarray(l_one), atol=1e-5)
    real = np.asarray(c_one.kv_mask)  # padding slots are masked: their keys never count
    for a, b in zip(c_chk.k + c_chk.v, c_one.k + c_one.v):
        np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real], atol=1e-5)
    for f in ("kv_mask", "positions", "index"):
        np.testing.assert_array_equal(np.asarray(getattr(c_chk, f)), np.asarray(getattr(c_one, f)))
    with pytest.raises(ValueError, match="chunk"):
        prefill(model, init_cache(model.config, B, T), jnp.asarray(ids), chunk=0)


def test_prefill_chunk_keeps_the_scores_within_budget():
    from verltool_jax.models.decode import PREFILL_SCORE_BUDGET, prefill_chunk

    assert prefill_chunk(4, 2, 256) == 512  # small: the largest chunk
    c = prefill_chunk(64, 1, 8192)  # the SQL smoke's JAX sampler
    assert 64 * 8192 * c <= PREFILL_SCORE_BUDGET < 64 * 8192 * 2 * c and c & (c - 1) == 0
    assert prefill_chunk(1024, 64, 1 << 20) == 16  # never below 16


def test_finished_rows_do_not_advance():
    model = load_hf(tiny_ckpt("qwen3"))
    ids, mask = padded_batch(seed=7)
    B, T = ids.shape
    cache = init_cache(model.config, B, T + 3)
    cache, logits = nnx.jit(prefill)(model, cache, jnp.asarray(ids), jnp.asarray(mask))
    tok = jnp.argmax(logits, -1)
    active = jnp.array([True, False, True, True])
    c1, l1 = nnx.jit(decode_step)(model, cache, tok, active)
    assert int(c1.positions[1]) == int(cache.positions[1])
    assert not bool(c1.kv_mask[1, T]) and bool(c1.kv_mask[0, T])
    # the inactive row's next real step gives what it would have without the idle step
    c2, l2 = nnx.jit(decode_step)(model, c1, tok)
    _, l_direct = nnx.jit(decode_step)(model, cache, tok)
    np.testing.assert_allclose(np.asarray(l2[1]), np.asarray(l_direct[1]), atol=1e-4)


def test_bad_shapes_are_named():
    model = load_hf(tiny_ckpt("qwen2"))
    cache = init_cache(model.config, 2, 8)
    with pytest.raises(ValueError, match="tokens"):
        decode_step(model, cache, jnp.zeros((2, 1), jnp.int32))
    with pytest.raises(ValueError, match="batch"):
        prefill(model, cache, jnp.zeros((3, 4), jnp.int32))
    with pytest.raises(ValueError, match="max_len"):
        init_cache(model.config, 2, 0)
