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
is wrong. Options (``--tool-opt``; defaults in :data:`IMAGE_OPTION_DEFAULTS`):
``image_max_images``, ``image_max_side``, ``image_max_zoom``, and two byte budgets of
decoded pixels (:func:`image_bytes`), the given images included: ``image_max_trajectory_mb``
for one trajectory's images together and ``image_max_total_mb`` for every trajectory's
images the server holds. An operation (or a given image) that would go over either is
refused, before it is decoded, with an observation naming the limit and its option; the
server keeps serving. There is no per-trajectory disk quota to spill to, so nothing spills.
A trajectory's images are freed when it ends (finish, last step, ``--state-ttl``), and
the freed heap is handed back to the system (``malloc_trim``): a server started by the
trainer inherits glibc tunables that otherwise keep freed memory in the process.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import stat
import sys
import threading
from collections.abc import Callable, Sequence
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

# The one source of the image tool's option defaults (``--tool-opt KEY=VALUE`` overrides).
IMAGE_OPTION_DEFAULTS: dict[str, int] = {
    "image_max_images": 64,  # images a trajectory may have, the given ones included
    "image_max_side": 4096,  # pixels on the longer side of a produced image
    "image_max_zoom": 8,  # largest zoom_in factor
    "image_max_trajectory_mb": 256,  # decoded MiB one trajectory's images hold together
    "image_max_total_mb": 1024,  # decoded MiB every trajectory's images hold together
}


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


def load_image(ref: Any, admit: Callable[[int], None] | None = None) -> Image.Image:
    """Open an image given as a file path, a ``data:image/...;base64,`` URL or raw bytes.
    ``admit`` is called with the decoded size (:func:`image_bytes`) read from the header,
    before the pixels are decoded; it raises ``ValueError`` to refuse the image."""
    if isinstance(ref, (bytes, bytearray)):
        data = bytes(ref)
    elif isinstance(ref, dict) and ("bytes" in ref or "path" in ref):
        return load_image(ref.get("bytes") or ref.get("path"), admit)
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
        if admit is not None:
            admit(image_bytes(img))
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


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def over_budget(
    held_trajectory: int, held_total: int, new: int, limit_trajectory: int, limit_total: int
) -> str | None:
    """Why ``new`` more decoded bytes may not be held, or None when they may.

    They may iff ``held_trajectory + new <= limit_trajectory`` (this trajectory's images)
    and ``held_total + new <= limit_total`` (every trajectory's images in the server).
    The reason names the limit and the ``--tool-opt`` that sets it.
    """
    if held_trajectory + new > limit_trajectory:
        return (
            f"this trajectory's images hold {_mib(held_trajectory)} and the new one needs "
            f"{_mib(new)}, over the {_mib(limit_trajectory)} limit per trajectory "
            "(image_max_trajectory_mb); crop to a smaller region or work on a smaller image."
        )
    if held_total + new > limit_total:
        return (
            f"the server's images hold {_mib(held_total)} for all trajectories and the new "
            f"one needs {_mib(new)}, over the server's {_mib(limit_total)} limit "
            "(image_max_total_mb); crop to a smaller region or try again later."
        )
    return None


class ImageLedger:
    """Decoded bytes the server's images hold, per trajectory and in total (thread-safe:
    sync tools run in the server's threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self.total = 0

    def held(self, trajectory_id: str) -> int:
        with self._lock:
            return self._held.get(trajectory_id, 0)

    def reserve(
        self, trajectory_id: str, new: int, limit_trajectory: int, limit_total: int
    ) -> None:
        """Count ``new`` bytes for the trajectory, or raise ``ValueError`` (:func:`over_budget`)."""
        with self._lock:
            mine = self._held.get(trajectory_id, 0)
            reason = over_budget(mine, self.total, new, limit_trajectory, limit_total)
            if reason is not None:
                raise ValueError(reason)
            self._held[trajectory_id] = mine + new
            self.total += new

    def release(self, trajectory_id: str) -> int:
        """Forget everything counted for the trajectory; the bytes it held."""
        with self._lock:
            freed = self._held.pop(trajectory_id, 0)
            self.total -= freed
            return freed


def return_freed_memory() -> None:
    """Hand the free pages of glibc's heap back to the system (``malloc_trim(0)``; a no-op
    off glibc). Needed because a server started by the trainer inherits its
    keep-freed-memory tunables (``verltool_jax/runtime/malloc_tuning.py``), under which freed
    image buffers would stay resident until the server exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        pass


class ImageTool(BaseTool):
    """``crop_image`` / ``zoom_in`` / ``rotate`` on the trajectory's images (Pillow)."""

    name = "image"
    usage = (
        '<tool_call>{"name": "crop_image", "arguments": {"bbox": [x0, y0, x1, y1], '
        '"image_index": -1, "padding": 0}}</tool_call>; also "zoom_in" (bbox, factor) and '
        '"rotate" (angle, expand). Boxes in pixels or normalised to [0, 1].'
    )

    def keeps_state(self, extra_field: dict) -> bool:
        return True  # the images of the trajectory (the ones it made too)

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return parse_tool_call_for(action, IMAGE_TOOL_NAMES)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ledger = ImageLedger()
        for key in IMAGE_OPTION_DEFAULTS:
            self._opt(key)  # a bad --tool-opt value stops the server at start, named

    def _opt(self, key: str) -> int:
        return tool_option(self.settings.extra, key, int, IMAGE_OPTION_DEFAULTS[key], minimum=1)

    def _reserve(self, trajectory_id: str, new: int) -> None:
        self.ledger.reserve(
            trajectory_id,
            new,
            self._opt("image_max_trajectory_mb") << 20,
            self._opt("image_max_total_mb") << 20,
        )

    def _images(self, trajectory_id: str, extra_field: dict) -> list:
        env = self.load_env(trajectory_id)
        if "images" not in env:
            refs = (extra_field or {}).get("images") or []
            if isinstance(refs, (str, bytes, dict)):
                refs = [refs]
            images: list[Image.Image] = []
            for i, ref in enumerate(refs):
                try:
                    images.append(load_image(ref, lambda n: self._reserve(trajectory_id, n)))
                except ValueError as e:
                    for img in images:
                        img.close()
                    self.ledger.release(trajectory_id)
                    raise ValueError(f'extra_field["images"][{i}]: {e}') from None
            env["images"] = images
        return env["images"]

    def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        if isinstance(parsed, ToolCallError):
            return invalid_call(parsed.message)
        assert isinstance(parsed, ToolCall)
        try:
            images = self._images(trajectory_id, extra_field)
            text, img = self._run(parsed, images)
            try:
                self._reserve(trajectory_id, image_bytes(img))
            except ValueError:
                img.close()
                raise
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
        limit = self._opt("image_max_images")
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
        max_side = self._opt("image_max_side")
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
            max_zoom = self._opt("image_max_zoom")
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
        if self.ledger.release(trajectory_id):
            return_freed_memory()
