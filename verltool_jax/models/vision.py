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

HF reorders the patches window by window before the blocks and back after the merger.
Here the patches keep the processor order; each attention layer gathers its segments
into a padded ``[G, L]`` batch (``attention_groups``: one row per window, or per image
frame for full attention), attends within each row, and scatters the result back. The
cost is ``G * L^2`` -- linear in the number of windows, and per image (not per batch)
quadratic for the full-attention blocks.
"""

from __future__ import annotations

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
    ``full_groups [Gf, Lf]`` / ``window_groups [Gw, Lw]`` int32: the patch indices of each
    image frame / each window, padded with -1 (``attention_groups``); a patch attends to
    the patches of its own row. Patches beyond the real ones (padding to a fixed ``N``)
    are in no group and never read back.
    """

    pixel_values: jnp.ndarray
    patch_positions: jnp.ndarray
    full_groups: jnp.ndarray
    window_groups: jnp.ndarray


def check_grid(image_grid_thw, vision: VisionConfig) -> np.ndarray:
    """``image_grid_thw`` as an ``[n, 3]`` int64 array; raises if a grid is not made of whole
    ``spatial_merge_size`` blocks."""
    g = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    m = vision.spatial_merge_size
    bad = [tuple(r) for r in g.tolist() if r[0] < 1 or r[1] % m or r[2] % m or min(r) < 1]
    if bad:
        raise ValueError(
            f"image_grid_thw rows {bad[:4]} must be (t >= 1, h, w) with h and w "
            f"positive multiples of spatial_merge_size={m}"
        )
    return g


def vision_layout(
    image_grid_thw, vision: VisionConfig, num_patches: int | None = None
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
        bh, bw, i, j = np.meshgrid(
            np.arange(h // m), np.arange(w // m), np.arange(m), np.arange(m), indexing="ij"
        )
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
            raise ValueError(
                f"num_patches={num_patches} must be >= the {n} real patches and "
                f"a multiple of spatial_merge_size**2={m * m}"
            )
        pad = num_patches - n
        positions = np.pad(positions, ((0, pad), (0, 0)))
        full_seg = np.pad(full_seg, (0, pad), constant_values=-1)
        win_seg = np.pad(win_seg, (0, pad), constant_values=-1)
    return positions, full_seg, win_seg


def attention_groups(segment: np.ndarray) -> np.ndarray:
    """``[G, L]`` int32: row ``g`` lists, in order, the indices ``i`` with ``segment[i] == g``
    (segments numbered ``0 .. G-1``; ``-1`` entries belong to none), padded with -1 to the
    largest segment's size ``L``."""
    seg = np.asarray(segment)
    real = np.nonzero(seg >= 0)[0]
    if real.size == 0:
        return np.full((0, 1), -1, np.int32)
    counts = np.bincount(seg[real])
    out = np.full((counts.size, int(counts.max())), -1, np.int32)
    order = real[np.argsort(seg[real], kind="stable")]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    col = np.arange(order.size) - np.repeat(starts, counts)
    out[seg[order], col] = order
    return out


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _pad_groups(groups: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.full((rows, cols), -1, np.int32)
    out[: groups.shape[0], : groups.shape[1]] = groups
    return out


def image_batch(
    pixel_values, image_grid_thw, vision: VisionConfig, bucket: bool = False
) -> ImageBatch:
    """Check ``pixel_values [N, patch_dim]`` against the grids and build the ``ImageBatch``.

    ``bucket=True`` pads every shape to a power of two (the patch count to ``m^2`` times
    one; a window group to the window's full patch count), so that a jitted step compiles
    for a few shapes instead of one per set of image sizes. Padding changes no output.
    """
    pv = np.asarray(pixel_values)
    grid = check_grid(image_grid_thw, vision)
    n = int(np.prod(grid, axis=1).sum())
    if pv.ndim != 2 or pv.shape != (n, vision.patch_dim):
        raise ValueError(
            f"pixel_values has shape {pv.shape}; image_grid_thw {grid.tolist()} "
            f"needs ({n}, {vision.patch_dim}) = (sum t*h*w, in_channels * "
            f"temporal_patch_size * patch_size**2) as the Qwen2-VL processor writes"
        )
    m2 = vision.spatial_merge_size**2
    num_patches = m2 * _pow2(n // m2) if bucket else None
    positions, full, win = vision_layout(grid, vision, num_patches)
    full_g, win_g = attention_groups(full), attention_groups(win)
    if num_patches is not None:  # bucket
        pv = np.pad(pv, ((0, num_patches - n), (0, 0)))
        full_g = _pad_groups(full_g, _pow2(full_g.shape[0]), _pow2(full_g.shape[1]))
        side = vision.window_size // vision.patch_size if vision.kind == "qwen2_5_vl" else 0
        win_cols = side * side if side else _pow2(win_g.shape[1])
        win_g = _pad_groups(win_g, _pow2(win_g.shape[0]), max(win_cols, win_g.shape[1]))
    return ImageBatch(
        pixel_values=jnp.asarray(pv, jnp.float32),
        patch_positions=jnp.asarray(positions),
        full_groups=jnp.asarray(full_g),
        window_groups=jnp.asarray(win_g),
    )


def quick_gelu(x):
    """``x * sigmoid(1.702 x)`` (CLIP's activation, Qwen2-VL's vision MLP)."""
    return x * jax.nn.sigmoid(1.702 * x)


_ACTIVATIONS = {
    "quick_gelu": quick_gelu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "silu": jax.nn.silu,
}


def _norm(cfg: ModelConfig, dim: int, rngs: nnx.Rngs):
    """Qwen2.5-VL: RMSNorm; Qwen2-VL: LayerNorm (with bias); both with eps 1e-6."""
    v = cfg.require_vision()
    if v.kind == "qwen2_5_vl":
        return RMSNorm(dim, v.norm_eps, cfg.dtype, cfg.param_dtype)
    return nnx.LayerNorm(
        dim,
        epsilon=v.norm_eps,
        dtype=dtype_of(cfg.dtype),
        param_dtype=dtype_of(cfg.param_dtype),
        rngs=rngs,
    )


class GeluMLP(nnx.Module):
    """Qwen2-VL vision MLP: ``fc2(act(fc1(x)))`` with biases."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.require_vision()
        self.fc1 = _linear(cfg, v.hidden_size, v.intermediate_size, True, rngs)
        self.fc2 = _linear(cfg, v.intermediate_size, v.hidden_size, True, rngs)
        self.act = v.hidden_act

    def __call__(self, x):
        return self.fc2(_ACTIVATIONS[self.act](self.fc1(x)))


class VisionAttention(nnx.Module):
    """Bidirectional multi-head attention with a fused ``qkv`` projection and 2-D RoPE."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.require_vision()
        self.qkv = _linear(cfg, v.hidden_size, 3 * v.hidden_size, True, rngs)
        self.proj = _linear(cfg, v.hidden_size, v.hidden_size, True, rngs)
        self.heads = v.num_heads
        self.rope_theta = v.rope_theta
        self.query_chunk = cfg.attention_query_chunk

    def __call__(self, x, positions, groups):
        """``x [N,W]``, ``positions [N,2]``, ``groups [G,L]`` (``attention_groups``) -> ``[N,W]``.

        Each patch attends to the patches of its group. RoPE: with ``D`` the head dim and
        ``f = rope_inv_freq(D / 2, theta)`` (``D/4`` frequencies), the ``D/2`` angles are
        ``[row * f, col * f]``.
        """
        N, W = x.shape
        D = W // self.heads
        qkv = self.qkv(x).reshape(N, 3, self.heads, D)
        f = rope_inv_freq(D // 2, self.rope_theta)
        inv, sections = np.concatenate([f, f]), (D // 4, D // 4)
        q = apply_rope(qkv[None, :, 0], positions[None], inv, sections)[0]
        k = apply_rope(qkv[None, :, 1], positions[None], inv, sections)[0]
        valid = groups >= 0
        idx = jnp.where(valid, groups, 0)
        mask = valid[:, None, :] & valid[:, :, None]
        out = attention_weights_apply(
            q[idx], k[idx], qkv[:, 2][idx], mask, self.query_chunk
        )  # [G,L,heads,D]
        # padding slots write to a spare row N, dropped
        y = jnp.zeros((N + 1, self.heads, D), out.dtype).at[jnp.where(valid, groups, N)].set(out)
        return self.proj(y[:N].reshape(N, W))


class VisionBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.require_vision()
        self.norm1 = _norm(cfg, v.hidden_size, rngs)
        self.norm2 = _norm(cfg, v.hidden_size, rngs)
        self.attn = VisionAttention(cfg, rngs)
        self.mlp: MLP | GeluMLP
        if v.kind == "qwen2_5_vl":
            self.mlp = MLP(cfg, rngs, v.hidden_size, v.intermediate_size, bias=True)
        else:
            self.mlp = GeluMLP(cfg, rngs)

    def __call__(self, x, positions, groups):
        x = x + self.attn(self.norm1(x), positions, groups)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
    """``mlp_out(gelu(mlp_in(concat over each m x m block of norm(x))))``: ``[N, W] ->
    [N / m^2, out_hidden_size]`` (GELU exact, as ``torch.nn.GELU()``)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.require_vision()
        wide = v.hidden_size * v.spatial_merge_size**2
        self.ln_q = _norm(cfg, v.hidden_size, rngs)
        self.mlp_in = _linear(cfg, wide, wide, True, rngs)
        self.mlp_out = _linear(cfg, wide, v.out_hidden_size, True, rngs)
        self.wide = wide

    def __call__(self, x):
        h = self.ln_q(x).reshape(-1, self.wide)
        return self.mlp_out(jax.nn.gelu(self.mlp_in(h), approximate=False))


def _block_call(block, x, positions, groups):
    return block(x, positions, groups)


class VisionTower(nnx.Module):
    """Patches ``[N, patch_dim]`` -> one embedding per merged ``m x m`` block ``[N/m^2, H]``."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        v = cfg.require_vision()
        self.vision = v
        self.dtype = cfg.dtype
        self.remat_policy = cfg.remat_policy
        self.patch_embed = _linear(cfg, v.patch_dim, v.hidden_size, False, rngs)
        self.blocks = nnx.List([VisionBlock(cfg, rngs) for _ in range(v.depth)])
        self.merger = PatchMerger(cfg, rngs)

    def __call__(self, images: ImageBatch) -> jnp.ndarray:
        from .transformer import remat_call

        x = self.patch_embed(images.pixel_values.astype(dtype_of(self.dtype)))
        pos = images.patch_positions
        for i, block in enumerate(self.blocks):
            groups = images.full_groups if self.vision.full_attention(i) else images.window_groups
            if self.remat_policy == "none":
                x = _block_call(block, x, pos, groups)
            else:
                x = remat_call(_block_call, block, x, pos, groups, policy=self.remat_policy)
        return self.merger(x)
