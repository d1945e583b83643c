"""The reward registry: reward functions by name, and which name serves a data_source.

A reward function is ``fn(response_text, ground_truth, extra_info) -> RewardResult``,
pure and picklable by name (it runs in reward worker processes). ``response_text`` is
the policy's own text (sampled tokens only, never tool observations).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verltool_jax.algos.registry import Registry


@dataclass
class RewardResult:
    """``score`` is the scalar reward; ``correct`` feeds the accuracy metric."""

    score: float
    correct: bool = False
    info: dict = field(default_factory=dict)


RewardFn = Callable[[str, Any, dict], RewardResult]

REWARDS: Registry[RewardFn] = Registry("reward function", "reward.name")

# data_source -> reward function name (exact match first, then the longest known prefix).
DATA_SOURCES: dict[str, str] = {}


def register_reward(name: str, *data_sources: str) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn`` as reward ``name``, serving rows whose data_source is in the list."""

    def deco(fn: RewardFn) -> RewardFn:
        REWARDS.register(name)(fn)
        for ds in data_sources:
            register_data_source(ds, name)
        return fn

    return deco


def register_data_source(data_source: str, reward_name: str) -> None:
    """Route rows with ``data_source`` (or a data_source starting with it) to ``reward_name``."""
    if data_source in DATA_SOURCES and DATA_SOURCES[data_source] != reward_name:
        raise ValueError(
            f"data_source {data_source!r} already uses reward {DATA_SOURCES[data_source]!r}"
        )
    DATA_SOURCES[data_source] = reward_name


def resolve_reward_name(data_source: str, name: str = "") -> str:
    """The reward for a row: ``name`` if given (config ``reward.name``), else by data_source."""
    if name:
        REWARDS.get(name)  # ValueError listing the choices if unknown
        return name
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    prefixes = [k for k in DATA_SOURCES if data_source.startswith(k)]
    if prefixes:
        return DATA_SOURCES[max(prefixes, key=len)]
    close = difflib.get_close_matches(data_source, list(DATA_SOURCES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"no reward function for data_source {data_source!r}{hint}; set "
        f"reward.name to one of {sorted(REWARDS.names())} or use a known "
        f"data_source: {sorted(DATA_SOURCES)}"
    )


def get_reward_fn(name: str) -> RewardFn:
    return REWARDS.get(name)
