"""Demonstrations -> token ids with a loss mask (the SFT warm start).

A demonstration is the prompt's messages plus ``response_segments``
``[{"text", "loss"}, ...]``. Each segment is encoded on its own and the ids are
concatenated, exactly as a rollout builds a response (model turns, then observation
tokens appended by us), so SFT and RL see the same token boundaries.
``loss_mask[i] = 1`` iff response token i comes from a ``loss=True`` segment (or is the
appended EOS); observation tokens get 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from verltool_jax.data.templating import encode_text, prompt_token_ids


@dataclass
class SFTExample:
    index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    row: dict = field(repr=False, default_factory=dict)


def tokenize_segments(tokenizer, segments: Sequence[dict], append_eos: bool = True
                      ) -> tuple[list[int], list[int]]:
    """(response_ids, loss_mask) of ``segments``; EOS appended with mask 1 if asked."""
    ids: list[int] = []
    mask: list[int] = []
    for seg in segments:
        seg_ids = encode_text(tokenizer, seg["text"])
        ids.extend(seg_ids)
        mask.extend([1 if seg["loss"] else 0] * len(seg_ids))
    if append_eos:
        eos: Optional[int] = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("append_eos=True but the tokenizer has no eos_token_id")
        ids.append(int(eos))
        mask.append(1)
    return ids, mask


def tokenize_sft_row(tokenizer, row: dict, index: int = 0, append_eos: bool = True
                     ) -> SFTExample:
    """Tokenize one validated SFT row (see ``rows.validate_sft_row``)."""
    response_ids, loss_mask = tokenize_segments(tokenizer, row["response_segments"], append_eos)
    return SFTExample(index=index, prompt_ids=prompt_token_ids(tokenizer, row["prompt"]),
                      response_ids=response_ids, loss_mask=loss_mask, row=row)
