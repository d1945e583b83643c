"""The Qwen2.5-VL / Qwen2-VL vision tower in Flax NNX, and the host-side patch layout it needs.

Input: ``pixel_values [N, patch_dim]``, the patches of every image of a batch one after
the other, exactly as the Qwen2-VL image processor emits them: per image of grid
``(t, h, w)`` (in patches), ``t * h * w`` rows ordered ``(t, h/m, w/m, m, m)`` -- each
``m x m`` block of neighbouring patches (``m = spatial_merge_size``) is contiguous -- and
each row flattened ``(channel, temporal, row, col)``.

The tower (``VisionTower``):

1. patch embedding: one linear map ``patch_dim -> hidden_size`` (HF stores it as a
   Conv3d whose kernel equals its stride, which is the same map);
2. ``depth`` pre-norm blocks ``x += attn(norm1(x)); x += mlp(norm2(x))``; attention has
   2-D RoPE (half the rotary frequencies follow the patch row, half the column) and is
   restricted to a *segment*: the whole image frame for full-attention blocks, the
   ``window_size x window_size``-pixel window for the others (Qwen2.5-VL);
3. the merger: ``norm``, concatenate each ``m x m`` block into one vector, ``Linear -> GELU
   -> Linear`` to the language model's width: one token per block.

HF reorders the patches window by window before the blocks and back after the merger;
attention without a causal mask is permutation-equivariant, so here the patches keep the
processor order and the window restriction is a mask built from segment ids
(``vision_layout``). The masks are ``[N, N]``: fine for the few thousand patches of an
RL prompt, quadratic beyond that.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from .config import ModelConfig, VisionConfig
from .layers import MLP, RMSNorm, _linear, attention_weights_apply, dtype_of
from .rope import apply_rope, rope_inv_freq


@struct.dataclass
class ImageBatch:
    """The images of one batch, ready for the tower (a pytree: pass it through ``jit``).

    ``pixel_values [N, patch_dim]`` (processor order, see the module docstring);
    ``patch_positions [N, 2]`` int32 (row, column of each patch in its image);
    ``full_segment [N]`` / ``window_segment [N]`` int32: patches attend to each other iff
    their segment ids are equal (full-attention blocks / window blocks). Rows beyond the
    real patches (padding to a fixed ``N``) have segment ``-1`` and are never read back.
    """
    pixel_values: jnp.ndarray
    patch_positions: jnp.ndarray
    full_segment: jnp.ndarray
    window_segment: jnp.ndarray


def check_grid(image_grid_thw, vision: VisionConfig) -> np.ndarray:
    """``image_grid_thw`` as an ``[n, 3]`` int64 array; raises if a grid is not made of whole
    ``spatial_merge_size`` blocks."""
    g = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    m = vision.spatial_merge_size
    bad = [tuple(r) for r in g.tolist() if r[0] < 1 or r[1] % m or r[2] % m or min(r) < 1]
    if bad:
        raise ValueError(f"image_grid_thw rows {bad[:4]} must be (t >= 1, h, w) with h and w "
                         f"positive multiples of spatial_merge_size={m}")
    return g


def vision_layout(image_grid_thw, vision: VisionConfig, num_patches: Optional[int] = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per patch, in processor order: ``(positions [N,2], full_segment [N], window_segment [N])``.

    For a patch at row ``r``, column ``c`` of frame ``f`` of image ``i``:
    ``positions = (r, c)``; ``full_segment`` numbers the pairs ``(i, f)``;
    ``window_segment`` numbers the triples ``(i, f, (r // m) // v, (c // m) // v)`` with
    ``v = window_size // spatial_merge_size // patch_size`` merged tokens per window side,
    windows tiling each frame from its top-left corner (as ``get_vision_window_index`` in
    transformers does). Qwen2-VL (no windows) gets ``window_segment = full_segment``.
    ``num_patches`` pads every array to that length with segment ``-1``.
    """
    grid = check_grid(image_grid_thw, vision)
    m = vision.spatial_merge_size
    v = vision.window_size // m // vision.patch_size if vision.kind == "qwen2_5_vl" else 0
    pos, full, win = [], [], []
    n_full = n_win = 0
    for t, h, w in grid.tolist():
        # processor order (h/m, w/m, m, m) within a frame
        bh, bw, i, j = np.meshgrid(np.arange(h // m), np.arange(w // m), np.arange(m),
                                   np.arange(m), indexing="ij")
        rows, cols = (bh * m + i).reshape(-1), (bw * m + j).reshape(-1)
        for _ in range(t):
            pos.append(np.stack([rows, cols], axis=-1))
            full.append(np.full(rows.shape, n_full))
            n_full += 1
            if v:
                nw = -(-(w // m) // v)
                wid = (bh // v) * nw + (bw // v)
                win.append(n_win + wid.reshape(-1))
                n_win += int(wid.max()) + 1
            else:
                win.append(full[-1])
    positions = np.concatenate(pos).astype(np.int32)
    full_seg = np.concatenate(full).astype(np.int32)
    win_seg = np.concatenate(win).astype(np.int32)
    n = positions.shape[0]
    if num_patches is not None:
        if num_patches < n or num_patches % (m * m):
            raise ValueError(f"num_patches={num_patches} must be >= the {n} real patches and "
                             f"a multiple of spatial_merge_size**2={m * m}")
        pad = num_patches - n
        positions = np.pad(positions, ((0, pad), (0, 0)))
        full_seg = np.pad(full_seg, (0, pad), constant_values=-1)
        win_seg = np.pad(win_seg, (0, pad), constant_values=-1)
    return positions, full_seg, win_seg


def image_batch(pixel_values, image_grid_thw, vision: VisionConfig,
                num_patches: Optional[int] = None) -> ImageBatch:
    """Check ``pixel_values [N, patch_dim]`` against the grids and build the ``ImageBatch``
    (``num_patches``: pad to a fixed size so that one compilation serves many batches)."""
    pv = np.asarray(pixel_values)
    grid = check_grid(image_grid_thw, vision)
    n = int(np.prod(grid, axis=1).sum())
    if pv.ndim != 2 or pv.shape != (n, vision.patch_dim):
        raise ValueError(f"pixel_values has shape {pv.shape}; image_grid_thw {grid.tolist()} "
                         f"needs ({n}, {vision.patch_dim}) = (sum t*h*w, in_channels * "
                         f"temporal_patch_size * patch_size**2) as the Qwen2-VL processor writes")
    positions, full, win = vision_layout(grid, vision, num_patches)
    if num_patches is not None:
        pv = np.pad(pv, ((0, num_patches - n), (0, 0)))
    return ImageBatch(pixel_values=jnp.asarray(pv, jnp.float32),
                      patch_positions=jnp.asarray(positions), full_segment=jnp.asarray(full),
                      window_segment=jnp.asarray(win))


def quick_gelu(x):
    """``x * sigmoid(1.702 x)`` (CLIP's activation, Qwen2-VL's vision MLP)."""
    return x * jax.nn.sigmoid(1.702 * x)


_ACTIVATIONS = {"quick_gelu": quick_gelu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
                "silu": jax.nn.silu}


def _norm(cfg: ModelConfig, dim: int, rngs: nnx.Rngs):
    """Qwen2.5-VL: RMSNorm; Qwen2-VL: LayerNorm (with bias); both with eps 1e-6."""
    v = cfg.vision
    if v.kind == "qwen2_5_vl":
        return RMSNorm(dim, v.norm_eps, cfg.dtype, cfg.param_dtype)
    return nnx.LayerNorm(dim, epsilon=v.norm_eps, dtype=dtype_of(cfg.dtype),
                         param_dtype=dtype_of(cfg.param_dtype), rngs=rngs)


class GeluMLP(nnx.Module):
    """Qwen2-VL vision MLP: ``fc2(act(fc1(x)))`` with biases."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.vision
        self.fc1 = _linear(cfg, v.hidden_size, v.intermediate_size, True, rngs)
        self.fc2 = _linear(cfg, v.intermediate_size, v.hidden_size, True, rngs)
        self.act = v.hidden_act

    def __call__(self, x):
        return self.fc2(_ACTIVATIONS[self.act](self.fc1(x)))


class VisionAttention(nnx.Module):
    """Bidirectional multi-head attention with a fused ``qkv`` projection and 2-D RoPE."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.vision
        self.qkv = _linear(cfg, v.hidden_size, 3 * v.hidden_size, True, rngs)
        self.proj = _linear(cfg, v.hidden_size, v.hidden_size, True, rngs)
        self.heads = v.num_heads
        self.rope_theta = v.rope_theta

    def __call__(self, x, positions, mask):
        """``x [1,N,W]``, ``positions [1,N,2]``, ``mask [1,N,N]`` -> ``[1,N,W]``.

        RoPE: with ``D`` the head dim and ``f = rope_inv_freq(D / 2, theta)`` (``D/4``
        frequencies), the ``D/2`` angles are ``[row * f, col * f]``.
        """
        B, N, W = x.shape
        D = W // self.heads
        q, k, val = jnp.split(self.qkv(x).reshape(B, N, 3, self.heads, D), 3, axis=2)
        q, k, val = q[:, :, 0], k[:, :, 0], val[:, :, 0]
        f = rope_inv_freq(D // 2, self.rope_theta)
        inv = np.concatenate([f, f])
        sections = (D // 4, D // 4)
        q = apply_rope(q, positions, inv, sections)
        k = apply_rope(k, positions, inv, sections)
        out = attention_weights_apply(q, k, val, mask)
        return self.proj(out.reshape(B, N, W))


class VisionBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.vision
        self.norm1 = _norm(cfg, v.hidden_size, rngs)
        self.norm2 = _norm(cfg, v.hidden_size, rngs)
        self.attn = VisionAttention(cfg, rngs)
        if v.kind == "qwen2_5_vl":
            self.mlp = MLP(cfg, rngs, v.hidden_size, v.intermediate_size, bias=True)
        else:
            self.mlp = GeluMLP(cfg, rngs)

    def __call__(self, x, positions, mask):
        x = x + self.attn(self.norm1(x), positions, mask)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
    """``mlp_out(gelu(mlp_in(concat over each m x m block of norm(x))))``: ``[N, W] ->
    [N / m^2, out_hidden_size]`` (GELU exact, as ``torch.nn.GELU()``)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.vision
        wide = v.hidden_size * v.spatial_merge_size ** 2
        self.ln_q = _norm(cfg, v.hidden_size, rngs)
        self.mlp_in = _linear(cfg, wide, wide, True, rngs)
        self.mlp_out = _linear(cfg, wide, v.out_hidden_size, True, rngs)
        self.wide = wide

    def __call__(self, x):
        h = self.ln_q(x).reshape(-1, self.wide)
        return self.mlp_out(jax.nn.gelu(self.mlp_in(h), approximate=False))


def _block_call(block, x, positions, mask):
    return block(x, positions, mask)


class VisionTower(nnx.Module):
    """Patches ``[N, patch_dim]`` -> one embedding per merged ``m x m`` block ``[N/m^2, H]``."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.vision
        self.vision = v
        self.dtype = cfg.dtype
        self.remat_policy = cfg.remat_policy
        self.patch_embed = _linear(cfg, v.patch_dim, v.hidden_size, False, rngs)
        self.blocks = nnx.List([VisionBlock(cfg, rngs) for _ in range(v.depth)])
        self.merger = PatchMerger(cfg, rngs)

    def __call__(self, images: ImageBatch) -> jnp.ndarray:
        from .transformer import REMAT_JAX_POLICIES
        x = self.patch_embed(images.pixel_values.astype(dtype_of(self.dtype)))[None]
        pos = images.patch_positions[None]
        full = images.full_segment
        win = images.window_segment
        masks = {True: (full[:, None] == full[None, :])[None],
                 False: (win[:, None] == win[None, :])[None]}
        for i, block in enumerate(self.blocks):
            mask = masks[self.vision.full_attention(i)]
            if self.remat_policy == "none":
                x = _block_call(block, x, pos, mask)
            else:
                x = nnx.remat(_block_call, policy=REMAT_JAX_POLICIES[self.remat_policy])(
                    block, x, pos, mask)
        return self.merger(x[0])
