"""Demonstrations -> token ids with a loss mask (the SFT warm start).

A demonstration is the prompt's messages plus ``response_segments``
``[{"text", "loss"}, ...]``. Each segment is encoded on its own and the ids are
concatenated, exactly as a rollout builds a response (model turns, then observation
tokens appended by us), so SFT and RL see the same token boundaries.
``loss_mask[i] = 1`` iff response token i comes from a ``loss=True`` segment (or is the
appended EOS); observation tokens get 0.

A segment with ``"observation": true`` holds a tool's raw answer: it is tokenized by the
rollout's own observation formatter (``rollout.obs_template`` around it, truncated to
``rollout.max_obs_tokens`` on ``rollout.obs_truncate_side``), so a demonstration shows an
observation exactly as a rollout would append it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from verltool_jax.data.templating import encode_text, prompt_token_ids


@dataclass
class SFTExample:
    index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    row: dict = field(repr=False, default_factory=dict)


# raw observation -> (ids, truncated): rollout.observation.ObservationFormatter
ObservationIds = Callable[[str], tuple[list[int], bool]]


def tokenize_segments(
    tokenizer,
    segments: Sequence[dict],
    append_eos: bool = True,
    observation_ids: ObservationIds | None = None,
) -> tuple[list[int], list[int]]:
    """(response_ids, loss_mask) of ``segments``; EOS appended with mask 1 if asked;
    ``observation`` segments through ``observation_ids`` (see the module doc)."""
    ids: list[int] = []
    mask: list[int] = []
    for seg in segments:
        if seg.get("observation"):
            if observation_ids is None:
                raise ValueError(
                    "a demonstration has an observation segment but no "
                    "observation formatter was given (the run's rollout "
                    "settings format it)"
                )
            seg_ids = observation_ids(seg["text"])[0]
        else:
            seg_ids = encode_text(tokenizer, seg["text"])
        ids.extend(seg_ids)
        mask.extend([1 if seg["loss"] else 0] * len(seg_ids))
    if append_eos:
        eos: int | None = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("append_eos=True but the tokenizer has no eos_token_id")
        ids.append(int(eos))
        mask.append(1)
    return ids, mask


def tokenize_sft_row(
    tokenizer,
    row: dict,
    index: int = 0,
    append_eos: bool = True,
    observation_ids: ObservationIds | None = None,
) -> SFTExample:
    """Tokenize one validated SFT row (see ``rows.validate_sft_row``)."""
    response_ids, loss_mask = tokenize_segments(
        tokenizer, row["response_segments"], append_eos, observation_ids
    )
    return SFTExample(
        index=index,
        prompt_ids=prompt_token_ids(tokenizer, row["prompt"]),
        response_ids=response_ids,
        loss_mask=loss_mask,
        row=row,
    )
