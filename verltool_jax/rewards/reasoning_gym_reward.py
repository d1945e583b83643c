"""reasoning-gym: procedural tasks scored by the dataset's own scorer.

`reasoning-gym <https://pypi.org/project/reasoning-gym/>`_ (Apache-2.0) generates
verifiable reasoning items procedurally (``create_dataset(name, seed=..., size=...)[i]``
is a dict ``{"question", "answer", "metadata"}``) and scores an answer with
``dataset.score_answer(answer, entry)`` in [0, 1] (exact answers 1; some datasets give
partial credit to near answers, e.g. a duration a second off).

Difficulty is a *level*: reasoning-gym's curriculum for the dataset (its attributes, each
with a list of values per level) set to one global level and read in upper-bound mode, so
level L holds only items of that level (``basic_arithmetic`` level 2: four terms of three
digits). A dataset without a curriculum has one level, 0.

A row's ground truth is the JSON of ``{"dataset", "config", "entry"}``: ``config`` the
dataset settings the item was generated with (the level's fields plus ``task.options``),
``entry`` the item itself; the reward rebuilds the dataset with those settings (cached
per worker) and scores ``<answer>...</answer>`` of the response with it.

Reward = the scorer's value; ``correct`` = the scorer gave exactly 1.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from verltool_jax.rewards.answer_extraction import extract_answer
from verltool_jax.rewards.base import RewardResult, register_reward

DATA_SOURCE = "reasoning_gym"
INSTALL_HINT = (
    "the reasoning_gym task needs the package reasoning-gym: "
    "pip install 'verltool-jax[reasoning-gym]' (or pip install reasoning-gym)"
)


def _rg():
    try:
        import reasoning_gym
    except ImportError as e:  # an optional extra
        raise ImportError(INSTALL_HINT) from e
    return reasoning_gym


def known_datasets() -> list[str]:
    """Every dataset name reasoning-gym registers."""
    return sorted(_rg().factory.DATASETS)


def _curriculum(name: str):
    factory = _rg().factory
    return factory.create_curriculum(name) if factory.has_curriculum(name) else None


def num_levels(name: str) -> int:
    """How many difficulty levels ``name`` has (its longest curriculum attribute)."""
    cur = _curriculum(name)
    if cur is None or not cur.attributes:
        return 1
    return max(len(a.levels) for a in cur.attributes.values())


def level_settings(name: str, level: int) -> dict[str, Any]:
    """The dataset settings of difficulty ``level`` (JSON-able): each curriculum attribute
    at ``min(level, its last level)``, ranges in upper-bound mode (reasoning-gym's
    ``RangeAttributeMode.UPPER_BOUND``: the level's own segment only)."""
    if level < 0:
        raise ValueError(f"reasoning_gym {name}: level must be >= 0, got {level}")
    cur = _curriculum(name)
    if cur is None:
        return {}
    from reasoning_gym.coaching.attributes import RangeAttributeDefinition
    from reasoning_gym.coaching.base_curriculum import (
        DefaultCurriculumContext,
        RangeAttributeMode,
    )

    cur.set_global_level(level)
    ctx = DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)
    out: dict[str, Any] = {}
    for attr in cur.attributes.values():
        value = ctx.get_attr_value(cur, attr)
        if isinstance(attr, RangeAttributeDefinition):
            vals = list(value) if isinstance(value, (list, tuple)) else [value]
            out[attr.lower_field_name] = min(vals)
            out[attr.upper_field_name] = max(vals)
        else:
            out[attr.field_name] = value
    return json.loads(json.dumps(out))  # tuples -> lists: what a ground truth holds


def make_dataset(name: str, settings: dict[str, Any], seed: int, size: int):
    """``reasoning_gym.create_dataset(name)`` with ``settings``; a clear error naming the
    dataset and the setting when reasoning-gym refuses them."""
    rg = _rg()
    if name not in rg.factory.DATASETS:
        import difflib

        close = difflib.get_close_matches(name, list(rg.factory.DATASETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"task.datasets: {name!r} is not a reasoning-gym dataset{hint}")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **settings)
    except (TypeError, ValueError, AssertionError) as e:
        raise ValueError(
            f"reasoning_gym {name}: reasoning-gym refused the settings {settings}: {e}"
        ) from e


@functools.lru_cache(maxsize=256)
def _scorer(name: str, settings_json: str):
    """A dataset built with ``settings`` (size 1: only its ``score_answer`` is used)."""
    return make_dataset(name, json.loads(settings_json), seed=0, size=1)


def ground_truth(name: str, settings: dict[str, Any], entry: dict) -> str:
    """What a row stores for the reward (see the module doc)."""
    item = {k: entry[k] for k in ("question", "answer", "metadata")}
    return json.dumps(
        {"dataset": name, "config": settings, "entry": item}, sort_keys=True, default=str
    )


def score(answer: str | None, gt: str | dict) -> float:
    """The dataset's own score of ``answer`` for the item in ``gt`` (a ground truth)."""
    g = json.loads(gt) if isinstance(gt, str) else gt
    if answer is None:
        return 0.0
    ds = _scorer(g["dataset"], json.dumps(g.get("config") or {}, sort_keys=True))
    return float(ds.score_answer(answer, g["entry"]))


@register_reward("reasoning_gym", DATA_SOURCE)
def reasoning_gym_reward(response: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    """``score_answer(<answer> of the response, item)`` of the item's own dataset."""
    pred = extract_answer(response)
    if pred is None:
        return RewardResult(0.0, False, {"pred": None, "has_answer": False})
    s = score(pred.strip(), ground_truth)
    return RewardResult(s, s >= 1.0, {"pred": pred, "has_answer": True})
