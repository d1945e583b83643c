"""The verl / VerlTool row layout and its validation.

A row is a dict::

    {"prompt": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...],
     "data_source": str,                       # selects the reward function
     "ability": str,                           # optional, e.g. "math"
     "reward_model": {"ground_truth": ..., "style": "rule"},
     "extra_info": {...}}                      # optional, free-form

SFT rows add ``response_segments``: ``[{"text": str, "loss": bool}, ...]`` (the
demonstrated response; ``loss=False`` for tool observations). Bad rows raise
:class:`DataRowError` naming the file, the row and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class DataRowError(ValueError):
    """A data row does not have the verl layout; the message names row, field and fix."""


def _fail(where: str, index: int, field: str, why: str) -> None:
    raise DataRowError(f"{where} row {index}: field {field!r} {why}")


def validate_row(row: Any, index: int, where: str = "data") -> dict:
    """Check one row (see the module doc) and return it as a plain dict."""
    if not isinstance(row, Mapping):
        raise DataRowError(
            f"{where} row {index}: expected a dict (an object per row), got {type(row).__name__}"
        )
    row = dict(row)
    prompt = row.get("prompt")
    if prompt is None:
        _fail(
            where,
            index,
            "prompt",
            "is missing; give a list of chat messages [{'role': 'user', 'content': '...'}]",
        )
    if isinstance(prompt, str):
        _fail(
            where,
            index,
            "prompt",
            "is a string; it must be a list of chat messages [{'role': 'user', 'content': '...'}]",
        )
    if not isinstance(prompt, (list, tuple)) or len(prompt) == 0:
        _fail(where, index, "prompt", "must be a non-empty list of chat messages")
    for j, msg in enumerate(prompt):
        if not isinstance(msg, Mapping):
            _fail(
                where,
                index,
                f"prompt[{j}]",
                f"must be a dict with 'role' and 'content', got {type(msg).__name__}",
            )
        if msg.get("role") not in ROLES:
            _fail(
                where,
                index,
                f"prompt[{j}].role",
                f"must be one of {list(ROLES)}, got {msg.get('role')!r}",
            )
        if not isinstance(msg.get("content"), str):
            _fail(
                where,
                index,
                f"prompt[{j}].content",
                f"must be a string, got {type(msg.get('content')).__name__}",
            )
    row["prompt"] = [{"role": m["role"], "content": m["content"]} for m in prompt]
    ds = row.get("data_source")
    if not isinstance(ds, str) or not ds:
        _fail(
            where,
            index,
            "data_source",
            f"must be a non-empty string naming the task (it selects the reward), got {ds!r}",
        )
    rm = row.get("reward_model")
    if not isinstance(rm, Mapping):
        _fail(
            where,
            index,
            "reward_model",
            "is missing or not a dict; give {'ground_truth': ..., 'style': 'rule'}",
        )
    if rm.get("ground_truth") is None:
        _fail(
            where,
            index,
            "reward_model.ground_truth",
            "is missing; every row needs the answer its reward is checked against",
        )
    row["reward_model"] = dict(rm)
    ability = row.get("ability")
    if ability is not None and not isinstance(ability, str):
        _fail(where, index, "ability", f"must be a string if given, got {type(ability).__name__}")
    extra = row.get("extra_info")
    if extra is None:
        row["extra_info"] = {}
    elif not isinstance(extra, Mapping):
        _fail(where, index, "extra_info", f"must be a dict if given, got {type(extra).__name__}")
    else:
        row["extra_info"] = dict(extra)
    return row


def validate_sft_row(row: Any, index: int, where: str = "data") -> dict:
    """``validate_row`` plus ``response_segments`` (a non-empty list of {text, loss})."""
    row = validate_row(row, index, where)
    segs = row.get("response_segments")
    if not isinstance(segs, (list, tuple)) or len(segs) == 0:
        _fail(
            where,
            index,
            "response_segments",
            "must be a non-empty list of {'text': str, 'loss': bool} for SFT rows",
        )
    out = []
    for j, seg in enumerate(segs):
        if not isinstance(seg, Mapping) or not isinstance(seg.get("text"), str):
            _fail(where, index, f"response_segments[{j}].text", "must be a string")
        if not isinstance(seg.get("loss"), bool):
            _fail(
                where,
                index,
                f"response_segments[{j}].loss",
                "must be true/false (false for tool observations)",
            )
        observation = seg.get("observation", False)
        if observation not in (True, False, None):
            _fail(
                where,
                index,
                f"response_segments[{j}].observation",
                "must be true/false "
                "(true: a raw tool answer, formatted as the rollout formats observations)",
            )
        if observation and seg["loss"]:
            _fail(
                where,
                index,
                f"response_segments[{j}].loss",
                "must be false for an observation segment (tool output is never trained on)",
            )
        out.append(
            {"text": seg["text"], "loss": seg["loss"]}
            | ({"observation": True} if observation else {})
        )
    row["response_segments"] = out
    return row


def ground_truth(row: Mapping) -> Any:
    """``row["reward_model"]["ground_truth"]``."""
    return row["reward_model"]["ground_truth"]
