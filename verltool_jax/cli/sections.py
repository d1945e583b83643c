"""Turning a config section into a component's settings dataclass.

``split_section(config.rollout, RolloutConfig)`` -> (kwargs the dataclass accepts, the
other keys), so a section may carry keys for several components (e.g. ``rollout.mode``
for the trainer next to the ``RolloutConfig`` fields) without either side guessing.
Tuples stay tuples; ConfigDicts become dicts.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections


def _plain(v: Any) -> Any:
    if isinstance(v, ml_collections.ConfigDict):
        return v.to_dict()
    if isinstance(v, list):
        return tuple(v)
    return v


def split_section(section: Mapping, cls: type) -> tuple[dict, dict]:
    """(fields of dataclass ``cls`` present in ``section``, the remaining keys)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    names = {f.name for f in dataclasses.fields(cls)}
    mine, rest = {}, {}
    for k in section.keys():
        (mine if k in names else rest)[k] = _plain(section[k])
    return mine, rest
