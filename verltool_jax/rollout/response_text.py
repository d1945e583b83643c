"""Text views of a trajectory's response, decoded from its token ids.

``response_segments`` splits the response into runs of equal ``loss_mask``: the model's
own turns (mask 1) and the observations we appended (mask 0). ``model_text`` joins only
the model's turns, so a reward never reads an answer a tool printed.
"""

from __future__ import annotations

from collections.abc import Sequence


def response_segments(
    response_ids: Sequence[int], loss_mask: Sequence[int], tokenizer
) -> list[tuple[str, bool]]:
    """[(text, is_model_turn), ...] in order, each a maximal run of equal mask."""
    if len(response_ids) != len(loss_mask):
        raise ValueError(
            f"response_ids ({len(response_ids)}) and loss_mask ({len(loss_mask)}) differ in length"
        )
    out: list[tuple[str, bool]] = []
    start = 0
    for i in range(1, len(response_ids) + 1):
        if i == len(response_ids) or bool(loss_mask[i]) != bool(loss_mask[start]):
            text = tokenizer.decode(list(response_ids[start:i]), skip_special_tokens=False)
            out.append((text, bool(loss_mask[start])))
            start = i
    return out


def model_text(response_ids: Sequence[int], loss_mask: Sequence[int], tokenizer) -> str:
    """The model's own text: its sampled turns, concatenated."""
    return "".join(
        t for t, is_model in response_segments(response_ids, loss_mask, tokenizer) if is_model
    )
