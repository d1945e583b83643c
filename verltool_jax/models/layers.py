"""Building blocks of the decoder: RMSNorm, grouped-query attention, SwiGLU MLP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .config import ModelConfig
from .lora import LoRALinear, wants_lora
from .rope import apply_rope, rope_inv_freq

# Large finite negative for masked scores: a fully masked row (a padding query) stays
# finite (uniform attention over garbage) instead of NaN; its output is never used.
MASK_VALUE = -1e30


def dtype_of(name: str):
    return jnp.dtype(name)


def _linear(
    cfg: ModelConfig,
    din: int,
    dout: int,
    bias: bool,
    rngs: nnx.Rngs,
    lora_at: tuple[int, str] | None = None,
) -> nnx.Linear:
    """A linear layer; ``lora_at = (layer, module name)`` adds a LoRA adapter when the
    config asks for one there (``models.lora``)."""
    kw = dict(
        use_bias=bias,
        dtype=dtype_of(cfg.dtype),
        param_dtype=dtype_of(cfg.param_dtype),
        kernel_init=nnx.initializers.normal(0.02),
        bias_init=nnx.initializers.zeros_init(),
        rngs=rngs,
    )
    if lora_at is not None and wants_lora(cfg, *lora_at):
        return LoRALinear(din, dout, rank=cfg.lora_rank, scale=cfg.lora_scale, **kw)
    return nnx.Linear(din, dout, **kw)


def on_rows(fn, x: jnp.ndarray) -> jnp.ndarray:
    """``fn`` applied to ``x [..., H]`` as a matrix of rows ``[N, H]``, its output ``[N, H']``
    reshaped back to ``[..., H']`` (a free reshape of contiguous rows).

    Projections go through this: on a 3-D ``[B, T, H]`` input, XLA's CPU backend emits the
    weight-gradient matmul (contracting over both B and T) behind elementwise fusions
    written in a transposed layout, which doubled the SwiGLU block's forward+backward time
    at SmolLM2 size; on 2-D rows it does not (docs/performance.md)."""
    y = fn(x.reshape(-1, x.shape[-1]))
    return y.reshape(x.shape[:-1] + y.shape[-1:])


class RMSNorm(nnx.Module):
    """``y = weight * x / sqrt(mean(x^2, -1) + eps)``; statistics in float32 (float64 for a
    float64 input), output in ``dtype``."""

    def __init__(self, dim: int, eps: float, dtype: str, param_dtype: str):
        self.weight = nnx.Param(jnp.ones((dim,), dtype_of(param_dtype)))
        self.eps = eps
        self.dtype = dtype_of(dtype)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(self.dtype) * xf.astype(self.dtype)


def _attend(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """One pass of :func:`attention_weights_apply` over all of ``q``'s positions."""
    B, T, N, D = q.shape
    K = k.shape[2]
    qg = q.reshape(B, T, K, N // K, D)
    acc = jnp.promote_types(q.dtype, jnp.float32)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=acc)
    scores = scores * (D**-0.5)  # rounded once to the scores' dtype, as transformers does
    scores = jnp.where(mask[:, None, None, :, :], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(B, T, N, D).astype(q.dtype)


def attention_weights_apply(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    mask: jnp.ndarray,
    query_chunk: int = 0,
    causal_block: int = 0,
) -> jnp.ndarray:
    """Grouped-query scaled dot-product attention.

    ``q [B,T,N,D]``, ``k, v [B,S,K,D]`` with ``N = K * G``; ``mask [B,T,S]`` True where query
    t may attend key s. ``out[b,t,n] = sum_s softmax_s(q.k / sqrt(D) | mask) v[b,s,n // G]``,
    scores and softmax in float32 (float64 for float64 inputs), output in ``q.dtype``.

    ``causal_block > 0`` declares the mask causal over the call's own tokens (``S == T`` and
    ``mask[b,t,s]`` False for every ``s > t``, as ``causal_padding_mask`` makes it): the
    queries then go ``causal_block`` at a time and the block ending at query ``e`` scores
    only keys ``0..e``, the keys after it being masked anyway. About half of the one pass's
    score, softmax and value work at ``T >> causal_block``; each real query's softmax runs
    over the same unmasked keys, so its output is the one pass's up to float32 summation
    order (a fully masked query row, i.e. left padding, averages other keys: its output is
    unused and differs).

    ``query_chunk > 0`` and ``T > query_chunk``: at most ``query_chunk`` queries at a time,
    each chunk rematerialised in the backward pass (``jax.checkpoint``; a ``lax.map`` when
    the mask is not declared causal), so the score tensor alive at once is
    ``[B, N, query_chunk, S]`` instead of ``[B, N, T, S]``. Without it, XLA's CPU backend
    kept several ``[B,N,T,S]`` tensors per trained layer in the backward pass of a
    3k-token batch, whatever the remat policy of unrolled layers (per-layer remat lowers
    the peak only with ``scan_layers``; docs/performance.md).
    """
    B, T, N, D = q.shape
    chunked = 0 < query_chunk < T
    if causal_block > 0:
        if k.shape[1] != T:
            raise ValueError(
                f"causal_block needs the call's own keys (S == T), got S={k.shape[1]}, T={T}"
            )
        c = min(causal_block, query_chunk) if chunked else causal_block
        if c >= T:
            return _attend(q, k, v, mask)

        def block(qb, mb, k, v, e: int):  # e (static): one past the block's last query
            return _attend(qb, k[:, :e], v[:, :e], mb[:, :, :e])

        f = jax.checkpoint(block, static_argnums=(4,)) if chunked else block
        outs = [f(q[:, a : a + c], mask[:, a : a + c], k, v, min(a + c, T)) for a in range(0, T, c)]
        return jnp.concatenate(outs, axis=1)
    if not chunked:
        return _attend(q, k, v, mask)
    c = int(query_chunk)
    n = -(-T // c)
    pad = n * c - T
    qc = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(B, n, c, N, D)
    mc = jnp.pad(mask, ((0, 0), (0, pad), (0, 0))).reshape(B, n, c, mask.shape[-1])
    body = jax.checkpoint(lambda qm: _attend(qm[0], k, v, qm[1]))
    out = jax.lax.map(body, (qc.transpose(1, 0, 2, 3, 4), mc.transpose(1, 0, 2, 3)))
    return out.transpose(1, 0, 2, 3, 4).reshape(B, n * c, N, D)[:, :T]


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, layer: int | None = None):
        H, N, K, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        at = lambda name: None if layer is None else (layer, name)
        self.q_proj = _linear(cfg, H, N * D, cfg.qkv_bias, rngs, at("q_proj"))
        self.k_proj = _linear(cfg, H, K * D, cfg.qkv_bias, rngs, at("k_proj"))
        self.v_proj = _linear(cfg, H, K * D, cfg.qkv_bias, rngs, at("v_proj"))
        self.o_proj = _linear(cfg, N * D, H, cfg.o_bias, rngs, at("o_proj"))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(D, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
            self.k_norm = RMSNorm(D, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
        self.qk_norm = cfg.qk_norm
        self.shape = (N, K, D)
        self.rope = (D, cfg.rope_theta, cfg.rope_scaling)  # static, hashable
        self.rope_sections = tuple(cfg.mrope_section)
        self.query_chunk = cfg.attention_query_chunk
        self.causal_block = cfg.attention_causal_block

    def __call__(self, x, positions, mask, kv_cache=None, write_index=0, prefix_kv=None):
        """``x [B,T,H]`` -> ``(out [B,T,H], (k, v))``; ``positions [B,T]``, or ``[B,T,3]``
        (temporal, height, width) with multimodal RoPE (``ModelConfig.mrope_section``).

        With ``prefix_kv = (k_prefix, v_prefix)`` of shape ``[B,P,K,D]`` (keys and values
        of earlier tokens, already rotated: a shared prompt's, ``Transformer.
        shared_prefix_hidden``) the queries attend over those P keys then this call's T
        own keys, ``mask [B,T,P+T]``; the returned ``(k, v)`` are this call's own.

        Without ``kv_cache`` the keys are this call's own tokens and ``mask [B,T,T]`` is
        causal (``transformer.causal_padding_mask``: no query attends a later key), which
        lets the attention skip the keys after each query block. With
        ``kv_cache = (k_cache, v_cache)`` of shape ``[B,S,K,D]``, this call's keys/values
        are written at slots ``write_index .. write_index+T-1`` and queries attend over all
        S slots (``mask [B,T,S]``); the updated caches are returned.
        """
        B, T, _ = x.shape
        N, K, D = self.shape
        q = on_rows(self.q_proj, x).reshape(B, T, N, D)
        k = on_rows(self.k_proj, x).reshape(B, T, K, D)
        v = on_rows(self.v_proj, x).reshape(B, T, K, D)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        inv_freq = rope_inv_freq(*self.rope)
        q = apply_rope(q, positions, inv_freq, self.rope_sections)
        k = apply_rope(k, positions, inv_freq, self.rope_sections)
        if prefix_kv is not None:
            kp, vp = prefix_kv
            out = attention_weights_apply(
                q,
                jnp.concatenate([kp.astype(q.dtype), k.astype(q.dtype)], axis=1),
                jnp.concatenate([vp.astype(q.dtype), v.astype(q.dtype)], axis=1),
                mask,
                self.query_chunk,
            )
            return on_rows(self.o_proj, out.reshape(B, T, N * D)), (k, v)
        if kv_cache is not None:
            kc, vc = kv_cache
            start = (0, write_index, 0, 0)
            k = jax.lax.dynamic_update_slice(kc, k.astype(kc.dtype), start)
            v = jax.lax.dynamic_update_slice(vc, v.astype(vc.dtype), start)
        out = attention_weights_apply(
            q,
            k.astype(q.dtype),
            v.astype(q.dtype),
            mask,
            self.query_chunk,
            self.causal_block if kv_cache is None else 0,
        )
        return on_rows(self.o_proj, out.reshape(B, T, N * D)), (k, v)


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``.

    Widths default to the decoder's (``cfg.hidden_size -> cfg.intermediate_size``); the
    Qwen2.5-VL vision blocks pass their own widths and ``bias=True``.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        rngs: nnx.Rngs,
        hidden: int | None = None,
        intermediate: int | None = None,
        bias: bool = False,
        layer: int | None = None,
    ):
        h = cfg.hidden_size if hidden is None else hidden
        inter = cfg.intermediate_size if intermediate is None else intermediate
        at = lambda name: None if layer is None else (layer, name)
        self.gate_proj = _linear(cfg, h, inter, bias, rngs, at("gate_proj"))
        self.up_proj = _linear(cfg, h, inter, bias, rngs, at("up_proj"))
        self.down_proj = _linear(cfg, inter, h, bias, rngs, at("down_proj"))

    def __call__(self, x):
        return on_rows(self._swiglu, x)

    def _swiglu(self, rows):
        return self.down_proj(jax.nn.silu(self.gate_proj(rows)) * self.up_proj(rows))


class DecoderLayer(nnx.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); out = h + mlp(norm(h))``."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, layer: int | None = None):
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
        self.attn = Attention(cfg, rngs, layer)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype, cfg.param_dtype)
        self.mlp = MLP(cfg, rngs, layer=layer)

    def __call__(self, x, positions, mask, kv_cache=None, write_index=0, prefix_kv=None):
        a, kv = self.attn(self.input_norm(x), positions, mask, kv_cache, write_index, prefix_kv)
        h = x + a
        return h + self.mlp(self.post_attn_norm(h)), kv
