"""``VisionLanguageModel``: Qwen2.5-VL / Qwen2-VL in Flax NNX -- the decoder (``Transformer``)
with multimodal RoPE plus the vision tower (``vision.VisionTower``).

A prompt holds, for each image, the run of ``image_token_id`` placeholders the processor
wrote (``t * h * w / m^2`` of them for a grid ``(t, h, w)``, between
``vision_start_token_id`` and ``vision_end_token_id``). The forward pass embeds the
tokens, runs the tower over all images of the batch, and puts the i-th image feature at
the i-th placeholder in row-major order (batch row, then position), as transformers'
``masked_scatter`` does. Positions are 3-axis (temporal, height, width; ``mrope_positions``)
and drive the M-RoPE frequency sections of ``ModelConfig.mrope_section``.

Host-side preparation (numpy, outside ``jit``): ``vl_inputs`` checks the placeholders
against the grids and returns ``positions`` and the ``ImageBatch``; the jitted forward
takes those as arrays. Parameter paths are the decoder's plus ``visual/...``, so the
decoder's sharding rules and name map apply unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from .config import ModelConfig
from .transformer import Transformer, text_only_error
from .vision import ImageBatch, VisionTower, check_grid, image_batch


def image_token_counts(image_grid_thw, config: ModelConfig) -> list[int]:
    """Placeholders per image: ``t * h * w / spatial_merge_size**2`` (one per merged block)."""
    m2 = config.require_vision().spatial_merge_size ** 2
    return [
        int(np.prod(g)) // m2 for g in check_grid(image_grid_thw, config.require_vision()).tolist()
    ]


def expand_image_tokens(token_ids, image_grid_thw, config: ModelConfig) -> list[int]:
    """Replace the i-th single ``image_token_id`` of ``token_ids`` by ``image_token_counts[i]``
    copies -- what the Qwen2-VL / Qwen2.5-VL processor does to each ``<|image_pad|>`` of the
    chat-templated text (the surrounding vision start / end tokens stay as they are)."""
    counts = iter(image_token_counts(image_grid_thw, config))
    out: list[int] = []
    for t in token_ids:
        if int(t) != config.image_token_id:
            out.append(int(t))
            continue
        n = next(counts, None)
        if n is None:
            raise ValueError("token_ids hold more image tokens than image_grid_thw has rows")
        out.extend([config.image_token_id] * n)
    if next(counts, None) is not None:
        raise ValueError("image_grid_thw has more rows than token_ids have image tokens")
    return out


def mrope_positions(
    input_ids, attention_mask, image_grid_thw, config: ModelConfig
) -> tuple[np.ndarray, np.ndarray]:
    """3-axis RoPE positions ``[B, T, 3]`` (int32) and each row's ``delta [B]``.

    The rule of transformers' ``Qwen2_5_VLModel.get_rope_index`` for images: walking the
    real tokens (``attention_mask`` 1) of a row with a counter ``p`` starting at 0, a text
    token gets ``(p, p, p)`` and ``p += 1``; an image of grid ``(t, h, w)`` (``m =
    spatial_merge_size``, ``h' = h/m``, ``w' = w/m``) covers the next ``t h' w'``
    placeholders, the one at ``(k, i, j)`` getting ``(p + k, p + i, p + j)``, then
    ``p += max(h', w')``. Images are taken in order across rows. Padding gets 0.
    ``delta = max position + 1 - number of real tokens``: a token appended later at text
    index ``n`` sits at ``n + delta`` on all three axes.
    """
    ids = np.asarray(input_ids)
    B, T = ids.shape
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
    v = config.require_vision()
    grids = iter(check_grid(image_grid_thw, v).tolist()) if image_grid_thw is not None else iter(())
    m = v.spatial_merge_size
    out = np.zeros((B, T, 3), np.int32)
    deltas = np.zeros((B,), np.int32)
    for b in range(B):
        real = np.nonzero(mask[b])[0]
        toks = ids[b, real]
        pos = np.zeros((len(real), 3), np.int64)
        p, k = 0, 0
        while k < len(toks):
            if toks[k] != config.image_token_id:
                pos[k] = p
                p, k = p + 1, k + 1
                continue
            g = next(grids, None)
            if g is None:
                raise ValueError(f"row {b}: more image placeholder runs than image_grid_thw rows")
            t, h, w = g[0], g[1] // m, g[2] // m
            n = t * h * w
            if k + n > len(toks) or not np.all(toks[k : k + n] == config.image_token_id):
                raise ValueError(
                    f"row {b}: image of grid {tuple(g)} needs {n} consecutive "
                    f"image tokens (id {config.image_token_id}) at real token {k}"
                )
            kk, ii, jj = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            pos[k : k + n] = p + np.stack([kk, ii, jj], -1).reshape(n, 3)
            p, k = p + max(h, w), k + n
        out[b, real] = pos
        deltas[b] = (pos.max() + 1 - len(real)) if len(real) else 0
    if next(grids, None) is not None:
        raise ValueError("image_grid_thw has more rows than the prompts have images")
    return out, deltas


def vl_inputs(
    config: ModelConfig,
    input_ids,
    attention_mask=None,
    pixel_values=None,
    image_grid_thw=None,
    bucket: bool = False,
) -> dict:
    """``{"positions": [B,T,3], "images": ImageBatch or None}`` for ``VisionLanguageModel``.

    Checks that every image has exactly its placeholders (``t*h*w / m^2`` image tokens,
    counted over real tokens) and that no video token is present (videos are not
    supported). ``bucket`` pads the image arrays to power-of-two shapes (see ``image_batch``).
    """
    if not config.is_vision_language:
        raise ValueError(text_only_error(config))
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {ids.shape}")
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
    real = mask.astype(bool)
    if config.video_token_id is not None and np.any((ids == config.video_token_id) & real):
        raise ValueError(
            f"input_ids hold video tokens (id {config.video_token_id}); only images are supported"
        )
    n_tokens = int(np.sum((ids == config.image_token_id) & real))
    if (pixel_values is None) != (image_grid_thw is None):
        raise ValueError("pixel_values and image_grid_thw go together; pass both or neither")
    n_feats = 0 if image_grid_thw is None else sum(image_token_counts(image_grid_thw, config))
    if n_tokens != n_feats:
        raise ValueError(
            f"the prompts hold {n_tokens} image tokens (id {config.image_token_id}) "
            f"but image_grid_thw gives {n_feats} image features; build input_ids "
            "and pixel_values with the same processor call"
        )
    positions, _ = mrope_positions(ids, mask, image_grid_thw, config)
    images = (
        None
        if pixel_values is None
        else image_batch(pixel_values, image_grid_thw, config.require_vision(), bucket)
    )
    return {"positions": jnp.asarray(positions), "images": images}


def scatter_image_features(embeds, input_ids, attention_mask, features, image_token_id: int):
    """``embeds [B,T,H]`` with the k-th real placeholder (row-major) replaced by
    ``features[k]``; ``features [M, H]`` may have padding rows at the end."""
    is_img = (input_ids == image_token_id) & attention_mask.astype(bool)
    B, T = input_ids.shape
    idx = jnp.cumsum(is_img.reshape(-1)) - 1
    idx = jnp.clip(idx, 0, features.shape[0] - 1).reshape(B, T)
    return jnp.where(is_img[..., None], features[idx].astype(embeds.dtype), embeds)


def flatten_row_images(rows: ImageBatch) -> ImageBatch:
    """One ``ImageBatch`` from per-row ones stacked on a leading batch axis (``rows.pixel_values
    [B, N, patch_dim]``, groups ``[B, G, L]`` indexing the row's own patches): row ``b``'s
    patches become ``b*N .. b*N+N-1`` and its groups are shifted by ``b*N``."""
    B, N = rows.pixel_values.shape[:2]
    off = (jnp.arange(B, dtype=jnp.int32) * N)[:, None, None]

    def shift(g):
        return jnp.where(g >= 0, g + off, -1).reshape(-1, g.shape[-1])

    return ImageBatch(
        pixel_values=rows.pixel_values.reshape(B * N, -1),
        patch_positions=rows.patch_positions.reshape(B * N, 2),
        full_groups=shift(rows.full_groups),
        window_groups=shift(rows.window_groups),
    )


def scatter_row_image_features(embeds, input_ids, attention_mask, features, image_token_id: int):
    """``embeds [B,T,H]`` with the k-th real placeholder of row b replaced by
    ``features[b, k]`` (``features [B, M, H]``: each row's image features in order)."""
    is_img = (input_ids == image_token_id) & attention_mask.astype(bool)
    idx = jnp.clip(jnp.cumsum(is_img, axis=1) - 1, 0, features.shape[1] - 1)
    picked = jnp.take_along_axis(features, idx[..., None], axis=1)
    return jnp.where(is_img[..., None], picked.astype(embeds.dtype), embeds)


class VisionLanguageModel(Transformer):
    """Qwen2.5-VL / Qwen2-VL: ``Transformer`` (M-RoPE) + ``visual`` (``VisionTower``)."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        if not config.is_vision_language:
            raise ValueError(
                f"VisionLanguageModel needs a VL config, got model_type {config.model_type!r}"
            )
        super().__init__(config, rngs)
        self.visual = VisionTower(config, rngs)

    def image_features(self, images: ImageBatch) -> jnp.ndarray:
        """``[N / m^2, H]``: one language-model embedding per merged patch block."""
        return self.visual(images)

    def hidden_states(
        self,
        input_ids,
        attention_mask=None,
        positions=None,
        inputs_embeds=None,
        images: ImageBatch | None = None,
        row_images: ImageBatch | None = None,
    ) -> jnp.ndarray:
        """Final-norm hidden states ``[B,T,H]``. ``positions [B,T,3]`` from ``vl_inputs``
        (``[B,T]`` is accepted for text-only prompts); ``images`` from ``vl_inputs``; or
        ``row_images``, each row's images on a leading batch axis (the train batch's layout,
        ``train.batch.image_rows``), which keeps working when the batch is split by rows."""
        input_ids = jnp.asarray(input_ids)
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        if row_images is not None:
            if images is not None or positions is None:
                raise ValueError("row_images needs positions= and excludes images=")
            B, N = row_images.pixel_values.shape[:2]
            feats = self.image_features(flatten_row_images(row_images))
            feats = feats.reshape(B, N // self.config.require_vision().spatial_merge_size ** 2, -1)
            if inputs_embeds is None:
                inputs_embeds = self.embed(input_ids)
            inputs_embeds = scatter_row_image_features(
                inputs_embeds,
                input_ids,
                attention_mask,
                feats,
                self.config.require_token_id("image_token_id"),
            )
        if images is not None:
            if positions is None:
                raise ValueError(
                    "images need their 3-axis positions: pass positions= from "
                    "vl_inputs(config, input_ids, attention_mask, pixel_values, "
                    "image_grid_thw)"
                )
            if inputs_embeds is None:
                inputs_embeds = self.embed(input_ids)
            inputs_embeds = scatter_image_features(
                inputs_embeds,
                input_ids,
                attention_mask,
                self.image_features(images),
                self.config.require_token_id("image_token_id"),
            )
        return super().hidden_states(input_ids, attention_mask, positions, inputs_embeds)


def model_class(config: ModelConfig) -> type:
    """The module class for ``config``: ``VisionLanguageModel`` for VL types, else ``Transformer``."""
    return VisionLanguageModel if config.is_vision_language else Transformer
