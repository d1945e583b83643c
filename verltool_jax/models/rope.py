"""Rotary position embeddings (RoPE) with the HF families' frequency scalings."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from .config import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling = RopeScaling()) -> np.ndarray:
    """Inverse frequencies ``[head_dim // 2]`` (float32) of RoPE.

    Base: ``inv_freq_i = theta ** (-2i / head_dim)`` for ``i = 0 .. head_dim/2 - 1``.

    * ``linear``: ``inv_freq / factor`` (positions are interpolated by ``factor``).
    * ``llama3``: with wavelength ``w = 2*pi / inv_freq``, ``L = original_max_position_embeddings``,
      ``w_lo = L / low_freq_factor`` and ``w_hi = L / high_freq_factor``:
      ``w < w_hi`` keeps ``inv_freq``; ``w > w_lo`` uses ``inv_freq / factor``; in between
      ``(1 - s) * inv_freq / factor + s * inv_freq`` with
      ``s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    exps = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    # transformers' order, ``1.0 / theta ** exps`` in float32, with the power correctly
    # rounded (float64, then rounded) as torch's float32 pow nearly always is; numpy's is
    # an ulp off on 5-25% of the entries, which turns every angle of those frequencies.
    powed = (np.float64(theta) ** exps.astype(np.float64)).astype(np.float32)
    inv = (np.float32(1.0) / powed).astype(np.float32)
    kind = scaling.rope_type
    if kind == "default":
        return inv
    if kind == "linear":
        return (inv / np.float32(scaling.factor)).astype(np.float32)
    if kind == "llama3":
        L = float(scaling.original_max_position_embeddings)
        lo, hi, f = scaling.low_freq_factor, scaling.high_freq_factor, scaling.factor
        if hi <= lo:
            raise ValueError(
                f"rope_scaling.high_freq_factor ({hi}) must exceed low_freq_factor ({lo})"
            )
        # float32 throughout; ``c / tensor`` is ``reciprocal(tensor) * c`` in torch (two
        # roundings), so transformers' ``2 * pi / inv_freq`` and ``L / wavelen`` are too.
        one = np.float32(1.0)
        wavelen = (one / inv) * np.float32(2.0 * math.pi)
        scaled = np.where(wavelen > L / lo, inv / f, inv)
        s = ((one / wavelen) * np.float32(L) - lo) / (hi - lo)
        smoothed = (1.0 - s) * scaled / f + s * scaled
        medium = (wavelen >= L / hi) & (wavelen <= L / lo)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise ValueError(f"rope_type {kind!r} is not supported (use default, linear or llama3)")


def section_index(sections: tuple[int, ...]) -> np.ndarray:
    """``[sum(sections)]`` int32: which position axis drives each frequency.

    Multimodal RoPE (M-RoPE, Qwen2-VL) splits the ``head_dim // 2`` frequencies into
    consecutive sections, one per position axis (temporal, height, width):
    ``sections = (16, 24, 24)`` gives frequency ``i`` the axis ``0`` for ``i < 16``, ``1``
    for ``16 <= i < 40`` and ``2`` after.
    """
    return np.repeat(np.arange(len(sections), dtype=np.int32), np.asarray(sections, np.int64))


def rope_angles(
    positions: jnp.ndarray, inv_freq, sections: tuple[int, ...] = (), dtype=jnp.float32
) -> jnp.ndarray:
    """Rotation angles ``[..., D/2]`` (in ``dtype``, float32 unless float64) of each token.

    ``positions [...]`` (one axis): ``a_i = positions * inv_freq_i``. ``positions [..., P]``
    (P axes, ``sections`` given): ``a_i = positions[..., axis(i)] * inv_freq_i`` with
    ``axis = section_index(sections)``; a text token whose axes are equal gets the plain
    1-D angles, which is why ``[...]`` positions are accepted with ``sections`` too.
    """
    inv = jnp.asarray(inv_freq, dtype)
    pos = positions.astype(dtype)
    if sections and pos.ndim == 3:
        if pos.shape[-1] != len(sections):
            raise ValueError(
                f"positions have {pos.shape[-1]} axes, rope sections {sections} "
                f"need {len(sections)}"
            )
        idx = section_index(sections)
        if idx.shape[0] != inv.shape[0]:
            raise ValueError(
                f"rope sections {sections} sum to {idx.shape[0]}, need "
                f"head_dim // 2 = {inv.shape[0]}"
            )
        return pos[..., idx] * inv
    return pos[..., None] * inv


def apply_rope(
    x: jnp.ndarray,
    positions: jnp.ndarray,
    inv_freq: jnp.ndarray | np.ndarray,
    sections: tuple[int, ...] = (),
) -> jnp.ndarray:
    """Rotate ``x [B, T, N, D]`` by angles ``rope_angles(positions, inv_freq, sections)``
    (HF half-split layout); ``positions`` is ``[B, T]``, or ``[B, T, P]`` for M-RoPE.

    With ``x = [x1, x2]`` split in halves along D and ``a`` the angles (float32; float64
    for a float64 ``x``):
    ``out = [x1 cos a - x2 sin a, x2 cos a + x1 sin a]``, returned in ``x.dtype``.
    """
    ang = rope_angles(positions, inv_freq, sections, jnp.promote_types(x.dtype, jnp.float32))
    cos = jnp.cos(ang)[:, :, None, :].astype(x.dtype)
    sin = jnp.sin(ang)[:, :, None, :].astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
