"""Observation tokens: tokenize on their own, truncate in tokens, wrap in the template.

The history is never re-tokenized: an observation is tokenized alone and its ids are
appended after the sampled ids, so the training sequence is exactly what the sampler saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def truncate_tokens(
    ids: Sequence[int], max_tokens: int, side: str, marker_ids: Sequence[int]
) -> list[int]:
    """Cut ``ids`` to at most ``max_tokens`` tokens, marker included.

    ``side="head"`` keeps the first tokens: ``ids[:k] + marker``;
    ``side="tail"`` keeps the last tokens: ``marker + ids[-k:]``, with
    ``k = max_tokens - len(marker_ids)``. If the marker alone does not fit
    (``k <= 0``), the kept part is ``max_tokens`` tokens without a marker.
    Sequences that already fit are returned unchanged.
    """
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    if side not in ("head", "tail"):
        raise ValueError(f"side must be 'head' or 'tail', got {side!r}")
    ids = list(ids)
    if len(ids) <= max_tokens:
        return ids
    k = max_tokens - len(marker_ids)
    if k <= 0:
        return ids[:max_tokens] if side == "head" else ids[len(ids) - max_tokens :]
    if side == "head":
        return ids[:k] + list(marker_ids)
    return list(marker_ids) + ids[len(ids) - k :]


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` alone, without special tokens added by the tokenizer."""
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


@dataclass
class ObservationFormatter:
    """Turns an observation string into the token ids appended to the response.

    ``ids = encode(prefix) + truncate(encode(obs)) + encode(suffix)`` where
    ``template = prefix + "{obs}" + suffix``. Prefix, suffix and marker are tokenized
    once. ``image_processor`` (``models.image_inputs.ImageProcessor``, vision-language
    policies only) turns an observation's images into patches; their placeholder ids go
    right after the prefix (see ``rollout.turns.TrajectoryBuilder``).
    """

    tokenizer: Any
    template: str
    max_obs_tokens: int
    side: str = "tail"
    marker: str = "...[truncated]..."
    image_processor: Any | None = None

    def __post_init__(self) -> None:
        if self.template.count("{obs}") != 1:
            raise ValueError(
                f"obs_template must contain '{{obs}}' exactly once, got {self.template!r}"
            )
        prefix, suffix = self.template.split("{obs}")
        self.prefix_ids = encode(self.tokenizer, prefix)
        self.suffix_ids = encode(self.tokenizer, suffix)
        self.marker_ids = encode(self.tokenizer, self.marker)

    def __call__(self, obs: str) -> tuple[list[int], bool]:
        """Return ``(ids, truncated)`` for one observation."""
        body = encode(self.tokenizer, obs)
        cut = truncate_tokens(body, self.max_obs_tokens, self.side, self.marker_ids)
        return self.prefix_ids + cut + self.suffix_ids, len(cut) != len(body) or cut != body
