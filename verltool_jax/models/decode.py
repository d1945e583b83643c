"""KV-cache decoding for the JAX sampler: ``init_cache``, ``prefill``, ``decode_step``.

Pure functions of ``(model, cache, tokens)`` returning a new cache; jit them with
``nnx.jit`` (or ``jax.jit`` around ``nnx.merge``) and donate the cache. Rows of a batch may
have different prompt lengths: a prompt is given left- or right-padded with its
``attention_mask``; every row keeps its own next position (``KVCache.positions``) and the
cache remembers which slots hold real tokens (``KVCache.kv_mask``). All rows write the
same slot per step (``KVCache.index``), so a padded slot simply stays masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from .config import ModelConfig


@struct.dataclass
class KVCache:
    """``k, v``: per-layer tuples of ``[B, S, num_kv_heads, head_dim]``; ``kv_mask [B, S]`` bool
    (slot holds a real token); ``positions [B]`` int32 (RoPE position of each row's next
    token); ``index`` int32 scalar (next slot to write, shared by all rows)."""

    k: tuple
    v: tuple
    kv_mask: jnp.ndarray
    positions: jnp.ndarray
    index: jnp.ndarray

    @property
    def max_len(self) -> int:
        return self.kv_mask.shape[1]


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
    """An empty cache for ``batch`` rows of up to ``max_len`` tokens (prompt + generation)."""
    if batch < 1 or max_len < 1:
        raise ValueError(f"init_cache needs batch >= 1 and max_len >= 1, got {batch}, {max_len}")
    dt = jnp.dtype(dtype or config.dtype)
    shape = (batch, max_len, config.num_kv_heads, config.head_dim)
    zeros = tuple(jnp.zeros(shape, dt) for _ in range(config.num_layers))
    return KVCache(
        k=zeros,
        v=tuple(jnp.zeros(shape, dt) for _ in range(config.num_layers)),
        kv_mask=jnp.zeros((batch, max_len), bool),
        positions=jnp.zeros((batch,), jnp.int32),
        index=jnp.zeros((), jnp.int32),
    )


def _extend(
    model, cache: KVCache, input_ids, attention_mask, positions=None, inputs_embeds=None, delta=None
):
    """Append ``input_ids [B,T]`` (mask ``[B,T]``) at slots ``index .. index+T-1``.

    Positions: ``cache.positions[b] + cumsum(mask[b]) - 1`` (padding repeats a position but
    is masked out), unless ``positions`` (e.g. M-RoPE ``[B,T,3]``) is given. Query t sees
    slot s iff ``kv_mask[b, s]`` and ``s <= index + t``. The next position of a row moves on
    by its real tokens plus ``delta [B]`` (M-RoPE: images advance the position counter by
    less than their token count). Returns ``(new cache, hidden [B,T,H])``.
    """
    B, T = input_ids.shape
    if cache.kv_mask.shape[0] != B:
        raise ValueError(f"cache batch {cache.kv_mask.shape[0]} != input batch {B}")
    mask = attention_mask.astype(bool)
    if positions is None:
        positions = cache.positions[:, None] + jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    kv_mask = jax.lax.dynamic_update_slice(cache.kv_mask, mask, (0, cache.index))
    slots = jnp.arange(cache.max_len)
    q_slots = cache.index + jnp.arange(T)
    attn = kv_mask[:, None, :] & (slots[None, None, :] <= q_slots[None, :, None])
    hidden, kvs = model.backbone(
        input_ids,
        positions,
        attn,
        list(zip(cache.k, cache.v)),
        cache.index,
        inputs_embeds=inputs_embeds,
    )
    advance = mask.sum(axis=1).astype(jnp.int32)
    if delta is not None:
        advance = advance + jnp.asarray(delta, jnp.int32)
    new = KVCache(
        k=tuple(k for k, _ in kvs),
        v=tuple(v for _, v in kvs),
        kv_mask=kv_mask,
        positions=cache.positions + advance,
        index=cache.index + T,
    )
    return new, hidden


# Prompt tokens go through the model in chunks, so that one chunk's attention scores
# (batch x heads x chunk x cache slots floats) stay within this many elements (256 MiB of
# float32): in one pass, 64 prompts of 4,096 tokens against 8,192 slots asked XLA for 26 GB.
PREFILL_SCORE_BUDGET = 1 << 26
MAX_PREFILL_CHUNK = 512


def prefill_chunk(
    batch: int, heads: int, cache_len: int, budget: int = PREFILL_SCORE_BUDGET
) -> int:
    """The prompt chunk of :func:`prefill`: the largest power of two ``c`` <= 512 with
    ``batch * heads * c * cache_len <= budget`` (at least 16)."""
    c = MAX_PREFILL_CHUNK
    while c > 16 and batch * heads * c * cache_len > budget:
        c //= 2
    return c


def prefill(model, cache: KVCache, input_ids, attention_mask=None, chunk: int | None = None):
    """Run the prompts ``input_ids [B,T]`` (left- or right-padded per ``attention_mask``),
    ``chunk`` tokens at a time (default :func:`prefill_chunk`): a ``lax.scan`` over the
    whole chunks (one compiled copy of the model), then the rest; each chunk extends the
    cache the previous one left, so the result equals one pass over all ``T``.

    Returns ``(cache, last_logits [B,V])``: the float32 logits after each row's last real
    token. The cache must have room: ``cache.index + T <= max_len`` (not checked under jit).
    """
    input_ids = jnp.asarray(input_ids)
    if attention_mask is None:
        attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    B, T = input_ids.shape
    if chunk is None:
        chunk = prefill_chunk(B, model.config.num_heads, cache.max_len)
    if chunk < 1:
        raise ValueError(f"prefill chunk must be >= 1, got {chunk}")
    n = T // chunk if T > chunk else 0
    parts = []
    if n:

        def body(c, xs):
            ids, m = xs
            return _extend(model, c, ids, m)

        split = lambda x: x[:, : n * chunk].reshape(B, n, chunk).swapaxes(0, 1)
        cache, hs = jax.lax.scan(body, cache, (split(input_ids), split(attention_mask)))
        parts.append(hs.swapaxes(0, 1).reshape(B, n * chunk, -1))
    if n * chunk < T:
        cache, h = _extend(model, cache, input_ids[:, n * chunk :], attention_mask[:, n * chunk :])
        parts.append(h)
    hidden = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
    last = T - 1 - jnp.argmax(attention_mask.astype(bool)[:, ::-1], axis=1)
    h_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    return cache, model.project(h_last)


def prefill_images(model, cache: KVCache, input_ids, attention_mask, positions, deltas, images):
    """``prefill`` for a vision-language model with images: the tower runs over ``images``
    (an ``ImageBatch`` holding the images of every row in row-major placeholder order), the
    features replace the placeholders, and the prompt runs with its M-RoPE ``positions
    [B,T,3]`` (``vision_language.mrope_positions``, counted from 0 for the new rows).
    ``deltas [B]`` (the rows' M-RoPE deltas, 0 for rows without new tokens) moves each row's
    next position to ``text index + delta``, which is where later tokens sit on all three
    axes. Returns ``(cache, last_logits [B,V])``."""
    from .vision_language import scatter_image_features

    input_ids = jnp.asarray(input_ids)
    embeds = scatter_image_features(
        model.embed(input_ids),
        input_ids,
        attention_mask,
        model.image_features(images),
        model.config.image_token_id,
    )
    cache, hidden = _extend(model, cache, input_ids, attention_mask, positions, embeds, deltas)
    T = input_ids.shape[1]
    last = T - 1 - jnp.argmax(attention_mask.astype(bool)[:, ::-1], axis=1)
    h_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    return cache, model.project(h_last)


def decode_step(model, cache: KVCache, tokens, active=None):
    """Feed one token per row (``tokens [B]``) -> ``(cache, logits [B,V])`` float32.

    ``active [B]`` (optional, bool): rows marked False (already finished) write a masked
    slot and do not advance their position.
    """
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"decode_step takes tokens [B], got shape {tokens.shape}")
    mask = jnp.ones(tokens.shape, bool) if active is None else jnp.asarray(active, bool)
    cache, hidden = _extend(model, cache, tokens[:, None], mask[:, None])
    return cache, model.project(hidden[:, 0])
