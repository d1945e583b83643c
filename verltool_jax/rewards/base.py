"""The reward registry: reward functions by name, and which name serves a data_source.

A reward function is ``fn(response_text, ground_truth, extra_info) -> RewardResult``,
pure and picklable by name (it runs in reward worker processes). ``response_text`` is
the policy's own text (sampled tokens only, never tool observations).

Installed packages add rewards through the entry-point group ``verltool_jax.rewards``:
the entry point's name is the reward's name, its value the reward function, and it
serves rows whose ``data_source`` is that name (or starts with it). They are loaded by
:func:`reward_plugins` on the first lookup (in every reward worker too); a clash with a
built-in reward or data_source, a clash between packages, or a failed import is a
``PluginError`` naming the package when that name is used (docs/plugins.md).
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from tool_server.kit.plugins import PluginError, PluginGroup, discover
from verltool_jax.algos.registry import Registry

REWARDS_GROUP = "verltool_jax.rewards"  # entry-point group of rewards from installed packages


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


def _check_reward(name: str, obj: object) -> str | None:
    """What is wrong with ``obj`` as the reward of entry point ``name`` (None: nothing)."""
    if not callable(obj):
        return f"points at {obj!r}, not a function fn(response_text, ground_truth, extra_info)"
    return None


_PLUGINS: PluginGroup | None = None
_PLUGINS_LOCK = threading.Lock()  # scoring runs in threads (score_async) and the loop


def reward_plugins(refresh: bool = False) -> PluginGroup:
    """The rewards installed packages declare, loaded and registered (each under its
    entry point's name, serving that data_source) on the first call in a process; those
    that cannot be used are logged and recorded in ``problems``. Called by every lookup
    of this module, after the built-in rewards have registered (so clashes are seen)."""
    global _PLUGINS
    with _PLUGINS_LOCK:
        if _PLUGINS is not None and refresh:  # forget the previous packages' rewards
            for name in _PLUGINS.plugins:
                REWARDS.unregister(name)
                if DATA_SOURCES.get(name) == name:
                    del DATA_SOURCES[name]
        if _PLUGINS is None or refresh:
            group = discover(
                REWARDS_GROUP, "reward", set(REWARDS.names()) | set(DATA_SOURCES), _check_reward
            )
            for name, fn in group.load_all().items():
                register_reward(name, name)(cast(RewardFn, fn))  # checked by _check_reward
            _PLUGINS = group
        return _PLUGINS


def _raise_if_unusable(name: str) -> None:
    problems = reward_plugins().problems
    if name in problems:
        raise PluginError(problems[name])


def resolve_reward_name(data_source: str, name: str = "") -> str:
    """The reward for a row: ``name`` if given (config ``reward.name``), else by data_source."""
    if name:
        _raise_if_unusable(name)
        REWARDS.get(name)  # ValueError listing the choices if unknown
        return name
    _raise_if_unusable(data_source)
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    prefixes = [k for k in DATA_SOURCES if data_source.startswith(k)]
    if prefixes:
        return DATA_SOURCES[max(prefixes, key=len)]
    close = difflib.get_close_matches(data_source, list(DATA_SOURCES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    broken = sorted(reward_plugins().problems)
    unusable = f"; reward plugins that cannot be used: {broken}" if broken else ""
    raise ValueError(
        f"no reward function for data_source {data_source!r}{hint}; set "
        f"reward.name to one of {sorted(REWARDS.names())} or use a known "
        f"data_source: {sorted(DATA_SOURCES)}{unusable} (python -m verltool_jax.plugins)"
    )


def get_reward_fn(name: str) -> RewardFn:
    """The reward function ``name`` (built in or from an installed package)."""
    _raise_if_unusable(name)
    return REWARDS.get(name)
