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
    inv = (1.0 / (np.float32(theta) ** exps)).astype(np.float32)
    kind = scaling.rope_type
    if kind == "default":
        return inv
    if kind == "linear":
        return (inv / np.float32(scaling.factor)).astype(np.float32)
    if kind == "llama3":
        L = float(scaling.original_max_position_embeddings)
        lo, hi, f = scaling.low_freq_factor, scaling.high_freq_factor, scaling.factor
        if hi <= lo:
            raise ValueError(f"rope_scaling.high_freq_factor ({hi}) must exceed "
                             f"low_freq_factor ({lo})")
        wavelen = 2.0 * math.pi / inv
        scaled = np.where(wavelen > L / lo, inv / f, inv)
        s = (L / wavelen - lo) / (hi - lo)
        smoothed = (1.0 - s) * scaled / f + s * scaled
        medium = (wavelen >= L / hi) & (wavelen <= L / lo)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise ValueError(f"rope_type {kind!r} is not supported (use default, linear or llama3)")


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, inv_freq: jnp.ndarray) -> jnp.ndarray:
    """Rotate ``x [B, T, N, D]`` by angles ``positions[b, t] * inv_freq`` (HF half-split layout).

    With ``x = [x1, x2]`` split in halves along D and ``a = positions * inv_freq`` (float32):
    ``out = [x1 cos a - x2 sin a, x2 cos a + x1 sin a]``, returned in ``x.dtype``.
    """
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    cos = jnp.cos(ang)[:, :, None, :].astype(x.dtype)
    sin = jnp.sin(ang)[:, :, None, :].astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
