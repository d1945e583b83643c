"""Image operations for the visual-reasoning task family: ``crop_image``, ``zoom_in``, ``rotate``.

Action: ``<tool_call>{"name": "crop_image", "arguments": {"bbox": [x0, y0, x1, y1]}}</tool_call>``.

The trajectory's images are ``extra_field["images"]`` (file paths or base64 ``data:`` URLs),
numbered 0, 1, ... in that order; every image an operation produces is appended and gets the
next number, so later calls can address it. Arguments:

* ``image_index`` (int, default ``-1`` = the latest image; negative counts from the end);
* ``bbox`` ``[x0, y0, x1, y1]`` (crop_image: required; zoom_in: default the whole image), in
  pixels or normalised to ``[0, 1]``; ``coords`` = ``"pixel"`` | ``"normalized"`` | ``"auto"``
  (default: normalised when every value is <= 1);
* ``padding`` (>= 0, same units as ``bbox``; the padded box is clipped to the image);
* ``factor`` (zoom_in, default 2, at most ``image_max_zoom``);
* ``angle`` (rotate, degrees counter-clockwise) and ``expand`` (default true: keep the corners).

The observation is ``{"obs": text with the new image's number and size, "image": data URL}``.
Every mistake (invalid JSON, unknown name, bad index, bad box) is an observation saying what
is wrong. Options (``--tool-opt``): ``image_max_images`` (64), ``image_max_side`` (4096),
``image_max_zoom`` (8), ``image_max_trajectory_mb`` (256: decoded pixels a trajectory's
images may hold together, the given ones included; an operation that would go over is
refused with an observation).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import stat
from collections.abc import Sequence
from typing import Any

from PIL import Image, UnidentifiedImageError

from tool_server.kit.base import BaseTool, Observation
from tool_server.kit.options import tool_option
from tool_server.kit.tool_calls import (
    ToolCall,
    ToolCallError,
    invalid_call,
    parse_tool_call_for,
    register_names,
)

IMAGE_TOOL_NAMES = register_names({"crop_image", "zoom_in", "rotate"})


# --- pure geometry -----------------------------------------------------------------------
def box_to_pixels(
    box: Sequence[float], width: int, height: int, coords: str = "auto"
) -> tuple[float, float, float, float]:
    """A box ``[x0, y0, x1, y1]`` in pixel units of a ``width`` x ``height`` image.

    ``coords="normalized"``: ``(x0*W, y0*H, x1*W, y1*H)``; ``"pixel"``: unchanged;
    ``"auto"``: normalised iff ``max(box) <= 1``. Raises ``ValueError`` (naming the field)
    for a box that is not 4 finite numbers.
    """
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        raise ValueError(f'"bbox" must be a list of 4 numbers [x0, y0, x1, y1], got {box!r:.80}.')
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box
    ):
        raise ValueError(f'"bbox" must contain 4 finite numbers, got {box!r:.80}.')
    if coords not in ("auto", "pixel", "normalized"):
        raise ValueError(f'"coords" must be "pixel", "normalized" or "auto", got {coords!r:.40}.')
    x0, y0, x1, y1 = (float(v) for v in box)
    if coords == "normalized" or (coords == "auto" and max(x0, y0, x1, y1) <= 1.0):
        return x0 * width, y0 * height, x1 * width, y1 * height
    return x0, y0, x1, y1


def resolve_box(
    box: Sequence[float], width: int, height: int, coords: str = "auto", padding: float = 0.0
) -> tuple[int, int, int, int]:
    """The integer pixel crop box of ``box`` on a ``width`` x ``height`` image.

    With ``(x0, y0, x1, y1) = box_to_pixels(box)`` the box must satisfy
    ``0 <= x0 < x1 <= W`` and ``0 <= y0 < y1 <= H`` (bounds checked, else ``ValueError``
    saying which side is out); then ``p`` = ``padding`` (in the box's units, so a fraction of
    the side when normalised) is added on every side, the result is clipped to the image, and
    rounded outwards: ``(floor(max(0, x0-p)), floor(max(0, y0-p)), ceil(min(W, x1+p)),
    ceil(min(H, y1+p)))``.
    """
    x0, y0, x1, y1 = box_to_pixels(box, width, height, coords)
    normalised = coords == "normalized" or (coords == "auto" and max(box) <= 1.0)
    if (
        not isinstance(padding, (int, float))
        or isinstance(padding, bool)
        or not (math.isfinite(padding) and padding >= 0)
    ):
        raise ValueError(f'"padding" must be a number >= 0, got {padding!r:.40}.')
    eps = 1e-6
    problems = []
    if x0 < -eps or y0 < -eps:
        problems.append(f"x0={box[0]}, y0={box[1]} must be >= 0")
    if x1 > width + eps:
        problems.append(
            f"x1={box[2]} exceeds the width {width}" + (" (normalised 1.0)" if normalised else "")
        )
    if y1 > height + eps:
        problems.append(
            f"y1={box[3]} exceeds the height {height}" + (" (normalised 1.0)" if normalised else "")
        )
    if x1 - x0 <= eps or y1 - y0 <= eps:
        problems.append("the box is empty: need x0 < x1 and y0 < y1")
    if problems:
        raise ValueError(
            f"bbox {list(box)} is invalid for an image of {width}x{height} pixels: "
            + "; ".join(problems)
            + "."
        )
    px = padding * width if normalised else padding
    py = padding * height if normalised else padding
    left, top = math.floor(max(0.0, x0 - px) + eps), math.floor(max(0.0, y0 - py) + eps)
    right = math.ceil(min(float(width), x1 + px) - eps)
    bottom = math.ceil(min(float(height), y1 + py) - eps)
    return left, top, max(right, left + 1), max(bottom, top + 1)


# --- image I/O -----------------------------------------------------------------------------
def image_bytes(img: Image.Image) -> int:
    """Memory Pillow holds for ``img`` decoded: ``width * height`` times 1 byte for 1-band
    8-bit modes (``1``, ``L``, ``P``), else 4 (Pillow stores RGB, RGBA, I, F... in 32-bit
    pixels)."""
    return img.width * img.height * (1 if img.mode in ("1", "L", "P") else 4)


def load_image(ref: Any, max_bytes: int | None = None) -> Image.Image:
    """Open an image given as a file path, a ``data:image/...;base64,`` URL or raw bytes.
    With ``max_bytes``, an image whose decoded size (:func:`image_bytes`) is larger is
    refused before it is decoded."""
    if isinstance(ref, (bytes, bytearray)):
        data = bytes(ref)
    elif isinstance(ref, dict) and ("bytes" in ref or "path" in ref):
        return load_image(ref.get("bytes") or ref.get("path"), max_bytes)
    elif isinstance(ref, str) and ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if ";base64" not in header:
            raise ValueError("image data URLs must be base64 encoded (data:image/png;base64,...)")
        try:
            data = base64.b64decode(payload, validate=False)
        except (binascii.Error, ValueError) as e:
            raise ValueError(f"image data URL is not valid base64: {e}") from None
    elif isinstance(ref, str):
        path = ref[len("file://") :] if ref.startswith("file://") else ref
        try:  # non-blocking and regular files only: a FIFO or device cannot hang a thread
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            raise ValueError(f"image file not found: {path}") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"image file is not a regular file: {path}")
            data = f.read()
    else:
        raise ValueError(f"an image must be a path or a data URL, got {type(ref).__name__}")
    try:
        img = Image.open(io.BytesIO(data))
        if max_bytes is not None and image_bytes(img) > max_bytes:
            raise ValueError(
                f"the image is {img.width}x{img.height} pixels "
                f"({image_bytes(img) >> 20} MB decoded), over the "
                f"{max_bytes >> 20} MB limit per trajectory"
            )
        img.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"cannot decode image: {e}") from None
    return img


def to_data_url(img: Image.Image) -> str:
    """PNG-encode ``img`` (zlib level 1) as a ``data:image/png;base64,...`` URL."""
    buf = io.BytesIO()
    if img.mode not in ("RGB", "RGBA", "L", "LA", "P", "1", "I", "I;16"):
        img = img.convert("RGB")
    img.save(buf, format="PNG", compress_level=1)  # fast; the size matters less here
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _number(args: dict, key: str, default: float) -> float:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f'"{key}" must be a number, got {v!r:.40}.')
    return float(v)


class ImageTool(BaseTool):
    """``crop_image`` / ``zoom_in`` / ``rotate`` on the trajectory's images (Pillow)."""

    name = "image"
    usage = (
        '<tool_call>{"name": "crop_image", "arguments": {"bbox": [x0, y0, x1, y1], '
        '"image_index": -1, "padding": 0}}</tool_call>; also "zoom_in" (bbox, factor) and '
        '"rotate" (angle, expand). Boxes in pixels or normalised to [0, 1].'
    )

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return parse_tool_call_for(action, IMAGE_TOOL_NAMES)

    def _opt(self, key: str, default: int) -> int:
        return tool_option(self.settings.extra, key, int, default, minimum=1)

    def _images(self, trajectory_id: str, extra_field: dict) -> list:
        env = self.load_env(trajectory_id)
        if "images" not in env:
            refs = (extra_field or {}).get("images") or []
            if isinstance(refs, (str, bytes, dict)):
                refs = [refs]
            images: list[Image.Image] = []
            budget = self._budget_bytes()
            for i, ref in enumerate(refs):
                try:
                    images.append(load_image(ref, budget - sum(map(image_bytes, images))))
                except ValueError as e:
                    for img in images:
                        img.close()
                    raise ValueError(f'extra_field["images"][{i}]: {e}') from None
            env["images"] = images
        return env["images"]

    def _budget_bytes(self) -> int:
        return self._opt("image_max_trajectory_mb", 256) << 20

    def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        if isinstance(parsed, ToolCallError):
            return invalid_call(parsed.message)
        assert isinstance(parsed, ToolCall)
        try:
            images = self._images(trajectory_id, extra_field)
            text, img = self._run(parsed, images)
            held = sum(map(image_bytes, images))
            if held + image_bytes(img) > self._budget_bytes():
                img.close()
                raise ValueError(
                    f"this trajectory's images already hold {held >> 20} MB and "
                    f"the new one would take {image_bytes(img) >> 20} MB, over the "
                    f"{self._budget_bytes() >> 20} MB limit per trajectory; crop "
                    "to a smaller region."
                )
        except ValueError as e:
            msg = f"{parsed.name} failed: {e}"
            return invalid_call(msg)
        images.append(img)
        idx = len(images) - 1
        return (
            {
                "obs": f"Image {idx}: {img.width}x{img.height} pixels ({text}).",
                "image": to_data_url(img),
            },
            False,
            True,
        )

    def _run(self, call: ToolCall, images: list) -> tuple[str, Image.Image]:
        args = call.arguments
        if not images:
            raise ValueError('this trajectory has no images (extra_field["images"] is empty).')
        limit = self._opt("image_max_images", 64)
        if len(images) >= limit:
            raise ValueError(f"this trajectory already has {len(images)} images (limit {limit}).")
        index = args.get("image_index", args.get("index", -1))
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(f'"image_index" must be an integer, got {index!r:.40}.')
        if not -len(images) <= index < len(images):
            raise ValueError(
                f"image_index {index} does not exist; valid indices are 0..."
                f"{len(images) - 1} (or -1 for the latest)."
            )
        src_idx = index % len(images)
        src = images[src_idx]
        max_side = self._opt("image_max_side", 4096)
        coords = args.get("coords", "auto")
        padding = args.get("padding", 0)
        unknown = set(args) - {
            "image_index",
            "index",
            "bbox",
            "coords",
            "padding",
            "factor",
            "angle",
            "expand",
        }
        if unknown:
            raise ValueError(f"unknown argument(s) {sorted(unknown)}.")
        if call.name == "crop_image":
            if "bbox" not in args:
                raise ValueError('missing argument "bbox" ([x0, y0, x1, y1]).')
            box = self._box(args["bbox"], src, src_idx, coords, padding)
            return f"crop_image of image {src_idx}, box {list(box)} px", src.crop(box)
        if call.name == "zoom_in":
            factor = _number(args, "factor", 2.0)
            max_zoom = self._opt("image_max_zoom", 8)
            if not 1.0 <= factor <= max_zoom:
                raise ValueError(f'"factor" must be between 1 and {max_zoom}, got {factor:g}.')
            box = self._box(
                args.get("bbox", [0, 0, src.width, src.height]),
                src,
                src_idx,
                "pixel" if "bbox" not in args else coords,
                padding,
            )
            w, h = box[2] - box[0], box[3] - box[1]
            nw, nh = max(1, round(w * factor)), max(1, round(h * factor))
            if max(nw, nh) > max_side:
                raise ValueError(
                    f"the zoomed image would be {nw}x{nh} pixels, over the "
                    f"{max_side}-pixel limit; use a smaller box or factor."
                )
            out = src.crop(box).resize((nw, nh), Image.Resampling.LANCZOS)
            return f"zoom_in x{factor:g} of image {src_idx}, box {list(box)} px", out
        # rotate
        angle = _number(args, "angle", float("nan")) if "angle" in args else None
        if angle is None:
            raise ValueError('missing argument "angle" (degrees, counter-clockwise).')
        expand = args.get("expand", True)
        if not isinstance(expand, bool):
            raise ValueError(f'"expand" must be true or false, got {expand!r:.40}.')
        quarter = angle % 360
        transposes = {
            90.0: Image.Transpose.ROTATE_90,
            180.0: Image.Transpose.ROTATE_180,
            270.0: Image.Transpose.ROTATE_270,
        }
        if quarter == 0:
            out = src.copy()
        elif quarter in transposes and (expand or quarter == 180.0):
            out = src.transpose(transposes[quarter])  # exact, no resampling
        else:
            out = src.rotate(angle, resample=Image.Resampling.BICUBIC, expand=expand)
        if max(out.size) > max_side:
            raise ValueError(
                f"the rotated image would be {out.width}x{out.height} pixels, "
                f"over the {max_side}-pixel limit."
            )
        return f"rotate of image {src_idx} by {angle:g} degrees", out

    @staticmethod
    def _box(
        bbox: Any, src: Image.Image, src_idx: int, coords: Any, padding: Any
    ) -> tuple[int, int, int, int]:
        try:
            return resolve_box(bbox, src.width, src.height, coords, padding)
        except ValueError as e:
            raise ValueError(f"image {src_idx}: {e}") from None

    def on_delete(self, trajectory_id: str, env: dict) -> None:
        for img in env.pop("images", []):
            img.close()
