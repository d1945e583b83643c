"""Images as a vision-language policy consumes them: decode, check the pixel budget, cut into
patches (``ImageInput``), and the placeholder ids each image takes in the token stream.

One ``ImageProcessor`` per run turns every image the policy sees (a data row's, a tool
observation's) into the Qwen2-VL image processor's ``pixel_values`` / ``image_grid_thw``
(transformers' ``Qwen2VLImageProcessorPil``: resize to multiples of ``patch_size *
spatial_merge_size`` within ``[min_pixels, max_pixels]``, normalise with the CLIP
mean / std, lay out the patches in processor order). In the token stream an image is
``<|vision_start|>`` + ``num_tokens`` x ``<|image_pad|>`` + ``<|vision_end|>`` with
``num_tokens = t*h*w / spatial_merge_size**2`` -- exactly what ``expand_image_tokens`` writes,
so sampler and trainer see the same ids.

Bad images raise ``ImageInputError`` (a ``ValueError``) saying what is wrong: one that cannot
be decoded, or one with more than ``max_pixels`` pixels (the pixel budget; it is refused
rather than silently shrunk, so a zoomed crop never loses the detail it was made for).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import ModelConfig


class ImageInputError(ValueError):
    """An image cannot be given to the policy (undecodable, over the pixel budget, or the
    policy is a text-only model); the message says which and what to do."""


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image ready for a vision-language model.

    ``pixel_values [t*h*w, patch_dim]`` float32 (processor order), ``grid_thw`` (in patches),
    ``num_tokens`` placeholders it takes, ``image`` the decoded RGB ``PIL.Image`` (what a vLLM
    engine and the reports get), ``config`` the ``ModelConfig`` it was cut for."""

    pixel_values: np.ndarray = field(repr=False)
    grid_thw: tuple[int, int, int]
    num_tokens: int
    image: Any = field(repr=False)
    config: Any = field(default=None, repr=False)

    def model_image(self):
        """The image at the size the vision tower sees it, ``(grid_w, grid_h) * patch_size``
        (resized as the processor resizes: PIL bicubic). An image processor given it keeps
        its size, so an engine with its own processor (vLLM) cuts the same patches."""
        from PIL import Image

        p = self.config.require_vision().patch_size
        want = (self.grid_thw[2] * p, self.grid_thw[1] * p)
        return self.image if self.image.size == want else self.image.resize(want, Image.BICUBIC)

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` of the decoded image."""
        return tuple(self.image.size)


def decode_image(ref: Any):
    """A ``PIL.Image`` (RGB) from a ``PIL.Image``, a uint8 ``[H, W, 3]`` array, raw bytes, a
    ``data:image/...;base64,`` URL, a file path, or verl's ``{"bytes": ..}`` / ``{"path": ..}``.
    Raises ``ImageInputError`` naming the problem."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    if isinstance(ref, np.ndarray):
        if ref.ndim != 3 or ref.shape[-1] not in (1, 3, 4) or ref.dtype != np.uint8:
            raise ImageInputError(
                f"an image array must be uint8 [height, width, 1|3|4], got {ref.dtype} {ref.shape}"
            )
        return Image.fromarray(ref[..., :3] if ref.shape[-1] != 1 else ref[..., 0]).convert("RGB")
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            return decode_image(ref["bytes"])
        if ref.get("path"):
            return decode_image(str(ref["path"]))
        raise ImageInputError(f"an image dict needs 'bytes' or 'path', got keys {sorted(ref)}")
    if isinstance(ref, str):
        if ref.startswith("data:"):
            head, _, b64 = ref.partition(",")
            if ";base64" not in head:
                raise ImageInputError(
                    "image data URLs must be base64 encoded (data:image/png;base64,...)"
                )
            try:
                ref = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError) as e:
                raise ImageInputError(f"image data URL is not valid base64: {e}") from None
        else:
            if not os.path.isfile(ref):
                raise ImageInputError(f"image file not found: {ref}")
            with open(ref, "rb") as f:
                ref = f.read()
    if not isinstance(ref, (bytes, bytearray)):
        raise ImageInputError(
            f"an image must be a path, a data URL, bytes, an array or a PIL "
            f"image, got {type(ref).__name__}"
        )
    try:
        with Image.open(io.BytesIO(ref)) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise ImageInputError(f"cannot decode image ({len(ref)} bytes): {e}") from None


class ImageProcessor:
    """Images -> ``ImageInput`` for the vision tower of ``config`` (see the module doc).

    ``max_pixels``: the pixel budget (width * height) of one image; larger images are
    refused. ``min_pixels``: smaller images are upscaled to at least this many pixels (as the
    Qwen2-VL processor does)."""

    def __init__(
        self, config: ModelConfig, max_pixels: int = 1280 * 28 * 28, min_pixels: int = 56 * 56
    ):
        if not config.is_vision_language:
            from .transformer import text_only_error

            raise ImageInputError(text_only_error(config))
        if config.vision_start_token_id is None or config.vision_end_token_id is None:
            raise ValueError(
                "ModelConfig.vision_start_token_id / vision_end_token_id are "
                "needed to place images in the token stream"
            )
        v = config.require_vision()
        factor = v.patch_size * v.spatial_merge_size
        if min_pixels < factor * factor or max_pixels < min_pixels:
            raise ValueError(
                f"need patch_size*merge^2 = {factor * factor} <= min_pixels "
                f"({min_pixels}) <= max_pixels ({max_pixels})"
            )
        from transformers import Qwen2VLImageProcessorPil

        self.config = config
        self.max_pixels, self.min_pixels = int(max_pixels), int(min_pixels)
        self._proc = Qwen2VLImageProcessorPil(
            patch_size=v.patch_size,
            temporal_patch_size=v.temporal_patch_size,
            merge_size=v.spatial_merge_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )

    def __call__(self, ref: Any) -> ImageInput:
        img = decode_image(ref)
        w, h = img.size
        if w * h > self.max_pixels:
            raise ImageInputError(
                f"the image is {w}x{h} = {w * h} pixels, over the pixel "
                f"budget max_pixels={self.max_pixels}; crop or shrink it, or "
                "raise the budget"
            )
        out = self._proc(images=[np.asarray(img)], return_tensors="np")
        pv = np.asarray(out["pixel_values"], np.float32)
        t, h, w = (int(x) for x in np.asarray(out["image_grid_thw"]).reshape(3))
        grid = (t, h, w)
        n = int(np.prod(grid)) // self.config.require_vision().spatial_merge_size ** 2
        return ImageInput(
            pixel_values=pv, grid_thw=grid, num_tokens=n, image=img, config=self.config
        )

    def placeholder_ids(self, image: ImageInput) -> list[int]:
        """``[vision_start] + [image_token] * num_tokens + [vision_end]``."""
        c = self.config
        return (
            [c.require_token_id("vision_start_token_id")]
            + [c.require_token_id("image_token_id")] * image.num_tokens
            + [c.require_token_id("vision_end_token_id")]
        )


def placeholder_runs(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """``(start, length)`` of every maximal run of ``image_token_id`` in ``token_ids``."""
    ids = np.asarray(token_ids)
    is_img = np.concatenate([[False], ids == image_token_id, [False]])
    edges = np.flatnonzero(is_img[1:] != is_img[:-1])
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2])]


def check_placeholders(
    token_ids: Sequence[int],
    images: Sequence[ImageInput],
    image_token_id: int,
    where: str = "prompt",
) -> list[int]:
    """Check that ``token_ids`` hold one run of ``image.num_tokens`` placeholders per image, in
    order; return each run's start. Raises ``ImageInputError`` saying what differs."""
    runs = placeholder_runs(token_ids, image_token_id)
    want = [im.num_tokens for im in images]
    got = [n for _, n in runs]
    if got != want:
        raise ImageInputError(
            f"{where}: the token ids hold image placeholder runs of lengths "
            f"{got} but the images need {want}; expand each <|image_pad|> "
            "with expand_image_tokens / ImageProcessor.placeholder_ids"
        )
    return [s for s, _ in runs]


def stack_images(images: Sequence[ImageInput]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(pixel_values [sum N, patch_dim], image_grid_thw [n, 3])`` of ``images`` in order, or
    ``(None, None)`` when there are none."""
    if not images:
        return None, None
    return (
        np.concatenate([im.pixel_values for im in images], 0),
        np.asarray([im.grid_thw for im in images], np.int64),
    )
