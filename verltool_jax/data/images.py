"""Data rows with images (verl's multimodal layout) -> prompt ids with expanded placeholders.

A row may carry ``images``: a list of images (file paths, ``data:`` URLs, raw bytes, or verl's
``{"bytes": ..}`` / ``{"path": ..}``), and its messages mark where each goes with ``<image>``
in their text (verl's ``RLHFDataset`` convention), in order. The message becomes a list of
parts (``{"type": "image"}`` / ``{"type": "text", "text": ..}``), the chat template writes
``<|vision_start|><|image_pad|><|vision_end|>`` per image part, and each ``<|image_pad|>`` is
expanded to the image's run of placeholders (``expand_image_tokens``): the ids the sampler
and the trainer both use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verltool_jax.data.rows import DataRowError
from verltool_jax.data.templating import encode_text, render_prompt

IMAGE_MARKER = "<image>"


def image_parts(messages: Sequence[dict]) -> list[dict]:
    """``messages`` with every ``<image>`` in a content string turned into an image part."""
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str) or IMAGE_MARKER not in content:
            out.append(dict(m))
            continue
        parts: list[dict] = []
        for k, piece in enumerate(content.split(IMAGE_MARKER)):
            if k:
                parts.append({"type": "image"})
            if piece:
                parts.append({"type": "text", "text": piece})
        out.append({**m, "content": parts})
    return out


def count_image_markers(messages: Sequence[dict]) -> int:
    return sum(
        m["content"].count(IMAGE_MARKER) for m in messages if isinstance(m.get("content"), str)
    )


def multimodal_prompt(
    tokenizer,
    messages: Sequence[dict],
    images: Sequence[Any],
    image_processor,
    where: str = "prompt",
) -> tuple[list[int], list]:
    """``(prompt ids, ImageInput list)`` for chat ``messages`` with ``<image>`` markers and
    their ``images`` (see the module doc). Raises ``DataRowError`` naming ``where`` when the
    markers and the images disagree, an image cannot be used, or the policy is text-only."""
    from verltool_jax.models.image_inputs import ImageInputError
    from verltool_jax.models.vision_language import expand_image_tokens

    n_markers = count_image_markers(messages)
    if image_processor is None:
        raise DataRowError(
            f"{where}: the row has {len(images)} image(s) but the policy is a "
            "text-only model; use a vision-language model (Qwen2.5-VL) or drop "
            "the row's 'images'"
        )
    if n_markers != len(images):
        raise DataRowError(
            f"{where}: field 'images' has {len(images)} image(s) but the prompt "
            f"has {n_markers} '{IMAGE_MARKER}' marker(s); put one marker where "
            "each image goes"
        )
    inputs = []
    for k, ref in enumerate(images):
        try:
            inputs.append(image_processor(ref))
        except ImageInputError as e:
            raise DataRowError(f"{where}: field 'images[{k}]': {e}") from None
    ids = encode_text(tokenizer, render_prompt(tokenizer, image_parts(messages)))
    cfg = image_processor.config
    n_pad = sum(1 for t in ids if t == cfg.image_token_id)
    if n_pad != len(inputs):
        raise DataRowError(
            f"{where}: the chat template wrote {n_pad} image token(s) (id "
            f"{cfg.image_token_id}) for {len(inputs)} image(s); the tokenizer's "
            "chat template must write <|image_pad|> for image parts"
        )
    return expand_image_tokens(ids, [im.grid_thw for im in inputs], cfg), inputs
