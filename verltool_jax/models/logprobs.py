"""Per-token log-probabilities without materialising the full ``[B, T, V]`` logits.

With vocabularies of ~150k the logits dominate memory (B*T*V floats, and as many again
for their gradient). ``chunked_logprobs`` computes them ``chunk_size`` positions at a
time inside ``lax.map`` and rematerialises each chunk in the backward pass, so the peak
is ``B * chunk_size * V`` instead of ``B * T * V``; when all of ``B * T * V`` fits in
``KEEP_LOGITS_BYTES`` (small vocabularies and batches, as on CPU) the logits are kept
for the backward instead, which saves a logits matmul.

With the sampler's top-k / top-p truncation (``top_k > 0`` or ``top_p < 1``) the
logprobs are those of the truncated, renormalised distribution the sampler drew from
(:func:`truncated_logprobs`), computed per chunk with plain autodiff under
``jax.checkpoint`` (the custom VJP below is the untruncated case's).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from verltool_jax.truncation import (
    TOP_K_OFF,
    TOP_P_OFF,
    truncate_logits,
    truncation_active,
)

Temperature = float | jnp.ndarray


def truncated_logprobs(
    z: jnp.ndarray,
    targets: jnp.ndarray,
    top_k: int = TOP_K_OFF,
    top_p: float = TOP_P_OFF,
    return_entropy: bool = False,
):
    """Logprobs of ``targets`` under the top-k / top-p truncated, renormalised softmax of
    ``z`` (logits already divided by T): ``z [..., V]``, ``targets [...]`` int -> ``[...]``
    float32 (and the truncated distribution's entropy when ``return_entropy``).

    ``K`` = the tokens the sampler keeps (``verltool_jax.truncation.truncate_logits``, the
    JAX sampler's own rule: the ``top_k`` largest, then the smallest prefix of the sorted
    distribution whose mass reaches ``top_p``) together with the target:
    ``log p_K(y) = z_y - logsumexp_{v in K} z_v``. That is the logprob vLLM reports
    (``processed_logprobs``) and the JAX sampler returns, so a trainer ratio against it is
    not biased by the truncation (the untruncated ``log_softmax(z)[y]`` is lower by
    ``-log P(K)`` on every token). The target is always in ``K``: the sampler drew it
    from its own kept set, and when the trainer's logits put it just outside theirs
    (the two engines' numerics differ) its logprob stays finite. verl computes the
    trainer's logprobs untruncated; this follows the sampler instead, on purpose.
    ``top_k <= 0`` and ``top_p = 1``: exactly ``log_softmax(z)[y]``.
    Gradients flow through ``z`` of the kept tokens; the kept set itself has none.
    """
    z = z.astype(jnp.float32)
    lead, V = z.shape[:-1], z.shape[-1]
    flat = z.reshape(-1, V)
    tgt = targets.reshape(-1).astype(jnp.int32)
    n = flat.shape[0]
    kept = truncate_logits(
        jax.lax.stop_gradient(flat),
        jnp.full((n,), top_k, jnp.int32),
        jnp.full((n,), top_p, jnp.float32),
    )
    hit = jax.lax.broadcasted_iota(jnp.int32, flat.shape, 1) == tgt[:, None]
    keep = (kept > -jnp.inf) | hit
    zk = jnp.where(keep, flat, -jnp.inf)
    lp_all = jax.nn.log_softmax(zk, axis=-1)
    logp = jnp.take_along_axis(lp_all, tgt[:, None], axis=-1)[:, 0].reshape(lead)
    if not return_entropy:
        return logp
    safe = jnp.where(keep, lp_all, 0.0)  # no 0 * -inf in the value or its gradient
    ent = -jnp.sum(jnp.exp(safe) * safe * keep, axis=-1).reshape(lead)
    return logp, ent


def _check_temperature(temperature) -> None:
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0 (logits are divided by it), got {temperature}")


def _chunk_logits(h, w, temperature):
    """``z = (h @ w) / T`` in float32: ``h [R,H]`` (rows), ``w [H,V]`` -> ``[R,V]``."""
    z = jnp.einsum("rh,hv->rv", h, w.astype(h.dtype), preferred_element_type=jnp.float32)
    return z / temperature


def _chunk_forward(z, tgt, with_entropy):
    """One chunk's statistics from its logits ``z`` and what its backward pass keeps:
    ``logp = z[tgt] - lse``, ``entropy = lse - E_p[z]`` with ``lse = logsumexp(z)``,
    ``p = softmax(z)``."""
    lse = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, tgt[..., None], axis=-1)[..., 0] - lse
    if not with_entropy:
        return (logp, jnp.zeros_like(logp)), (lse, jnp.zeros_like(lse))
    mean_z = jnp.sum(jnp.exp(z - lse[..., None]) * z, axis=-1)
    return (logp, lse - mean_z), (lse, mean_z)


# The chunks' logits are kept from the forward pass for the backward when all of them
# (float32, B x T x V) fit in this many bytes: the backward then skips one logits matmul
# (a quarter of the LM head's work, a third with a frozen head); above it they are
# recomputed per chunk, so the peak stays B x chunk x V (module docstring).
KEEP_LOGITS_BYTES = 1 << 30


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _chunk_stats(h, w, tgt, temperature, with_entropy, keep_logits):
    """One chunk: ``(logp, entropy)`` of ``z = (h @ w) / T`` at ``tgt`` (entropy zeros unless
    ``with_entropy``). Differentiated by :func:`_chunk_stats_bwd`, which gets ``z`` from
    the forward pass when ``keep_logits``, else recomputes it."""
    return _chunk_forward(_chunk_logits(h, w, temperature), tgt, with_entropy)[0]


def _chunk_stats_fwd(h, w, tgt, temperature, with_entropy, keep_logits):
    z = _chunk_logits(h, w, temperature)
    out, (lse, mean_z) = _chunk_forward(z, tgt, with_entropy)
    return out, (h, w, tgt, temperature, lse, mean_z, z if keep_logits else None)


def _chunk_stats_bwd(with_entropy, keep_logits, res, cotangents):
    """Backward pass of one chunk, with its logits kept from the forward pass
    (``keep_logits``) or recomputed from ``h`` and ``w`` (never kept: the peak stays one
    chunk's), reusing the forward's ``lse`` (and ``E_p[z]``), so no reduction over V is
    repeated.

    With ``p = exp(z - lse)``, ``g`` and ``e`` the cotangents of logp and entropy:
    ``d logp / dz_v = [v = tgt] - p_v``; ``d entropy / dz_v = p_v (E_p[z] - z_v)``; so
    ``dz = g ([v = tgt] - p) + e p (E_p[z] - z)``, and with ``z = h w / T``:
    ``dh = (dz / T) w^T``, ``dw = h^T (dz / T)`` (summed over the chunk's rows; rows, not
    ``[B, c]``, so that XLA's CPU backend emits plain 2-D matmuls, see ``layers.on_rows``).
    The temperature and the targets get zero cotangents (they are not trained).
    """
    h, w, tgt, temperature, lse, mean_z, kept = res
    g, e = cotangents
    z = kept if keep_logits else _chunk_logits(h, w, temperature)
    p = jnp.exp(z - lse[..., None])
    hit = jax.lax.broadcasted_iota(jnp.int32, z.shape, 1) == tgt[..., None]
    dz = g[..., None] * (hit.astype(z.dtype) - p)
    if with_entropy:
        dz = dz + e[..., None] * p * (mean_z[..., None] - z)
    dz = (dz / temperature).astype(h.dtype)
    dh = jnp.einsum("rv,hv->rh", dz, w.astype(h.dtype), preferred_element_type=jnp.float32)
    dw = jnp.einsum("rh,rv->hv", h, dz, preferred_element_type=jnp.float32)
    zero_tgt = np.zeros(tgt.shape, dtype=jax.dtypes.float0)
    return dh.astype(h.dtype), dw.astype(w.dtype), zero_tgt, jnp.zeros_like(temperature)


_chunk_stats.defvjp(_chunk_stats_fwd, _chunk_stats_bwd)


def chunked_logprobs(
    hidden: jnp.ndarray,
    weight: jnp.ndarray,
    targets: jax.Array | np.ndarray,
    temperature: Temperature = 1.0,
    chunk_size: int = 256,
    return_entropy: bool = False,
    top_k: int = TOP_K_OFF,
    top_p: float = TOP_P_OFF,
    keep_logits_bytes: int | None = None,
):
    """``log softmax(hidden @ weight / T)[targets]`` per position, ``chunk_size`` positions at a time.

    ``hidden [B,T,H]``, ``weight [H,V]``, ``targets [B,T]`` int -> ``[B,T]`` float32 (and the
    entropy ``-sum p log p`` of the same distribution when ``return_entropy``). A custom VJP
    keeps ``lse`` per row and, when all the chunks' float32 logits fit in
    ``keep_logits_bytes`` (None: :data:`KEEP_LOGITS_BYTES`), the logits themselves for the
    backward pass; otherwise each chunk's logits are recomputed there.
    With ``top_k > 0`` or ``top_p < 1``: :func:`truncated_logprobs` of each chunk instead
    (the chunk rematerialised by ``jax.checkpoint``).
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
    # chunk i holds positions i*c .. i*c+c-1 of every row, as B*c rows
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(B, n, c, H).transpose(1, 0, 2, 3)
    h = h.reshape(n, B * c, H)
    t = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, pad))).reshape(B, n, c).transpose(1, 0, 2)
    t = t.reshape(n, B * c)
    temp = jnp.asarray(temperature, jnp.float32)
    if truncation_active(top_k, top_p):

        @jax.checkpoint
        def chunk(xs):
            z = _chunk_logits(xs[0], weight, temp)
            out = truncated_logprobs(z, xs[1], top_k, top_p, return_entropy=True)
            return out if return_entropy else (out[0], jnp.zeros_like(out[0]))

    else:
        budget = KEEP_LOGITS_BYTES if keep_logits_bytes is None else keep_logits_bytes
        keep = n * B * c * weight.shape[-1] * 4 <= budget

        def chunk(xs):
            return _chunk_stats(xs[0], weight, xs[1], temp, return_entropy, keep)

    logp, ent = jax.lax.map(chunk, (h, t))

    def per_row(x):  # [n, B*c] -> [B, T]
        return x.reshape(n, B, c).transpose(1, 0, 2).reshape(B, n * c)[:, :T]

    if not return_entropy:
        return per_row(logp)
    return per_row(logp), per_row(ent)


def token_logprobs(
    model,
    input_ids: jax.Array | np.ndarray,
    attention_mask: jax.Array | np.ndarray,
    targets: jax.Array | np.ndarray,
    temperature: Temperature = 1.0,
    chunk_size: int = 256,
    return_entropy: bool = False,
    positions=None,
    images=None,
    row_images=None,
    prefix=None,
    top_k: int = TOP_K_OFF,
    top_p: float = TOP_P_OFF,
):
    """``log softmax(model(input_ids)/T)[targets]`` -> ``[B,T]`` float32, chunked over the sequence.

    ``targets[b, t]`` is the token whose probability position t predicts (usually
    ``input_ids[b, t+1]``); the caller masks positions that are not scored. With
    ``return_entropy=True`` returns ``(logprobs, entropy)``; ``top_k`` / ``top_p``: the
    sampler's truncation, renormalised over its kept set (:func:`truncated_logprobs`;
    off by default). A vision-language model takes
    ``positions`` and ``images`` from ``vision_language.vl_inputs`` (or ``row_images``, the
    train batch's per-row layout).

    ``prefix = (prefix_ids, prefix_mask) [G,P]``: the rows (``B = G*n``, grouped in order)
    continue these shared prefixes, which are not scored
    (``Transformer.shared_prefix_hidden``); the result is the ``[B,T]`` of the rows, equal
    to scoring ``prefix + row`` whole. Text-only models.
    """
    if prefix is not None:
        if positions is not None or images is not None or row_images is not None:
            raise ValueError("a shared prefix is for text-only batches (no positions, images)")
        hidden = model.shared_prefix_hidden(prefix[0], prefix[1], input_ids, attention_mask)
    else:
        kw = {"row_images": row_images} if row_images is not None else {}
        hidden = model.hidden_states(input_ids, attention_mask, positions, images=images, **kw)
    return chunked_logprobs(
        hidden,
        model.lm_head_weight(),
        targets,
        temperature,
        chunk_size,
        return_entropy,
        top_k,
        top_p,
    )


def naive_logprobs(logits: jnp.ndarray, targets: jnp.ndarray, temperature: Temperature = 1.0):
    """Reference: full ``log_softmax(logits / T)`` gathered at ``targets`` (materialises [B,T,V])."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    return jnp.take_along_axis(lp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
