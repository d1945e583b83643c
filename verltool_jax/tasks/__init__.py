"""Generated tasks: data written in the verl layout, selected by ``config.task.name``.

Each task registers a :class:`TaskSpec`: a frozen dataclass typing its ``task`` config
section (a ``name`` field plus the task's own knobs, with their defaults) and a
``prepare(run_config, out_dir) -> TaskFiles`` that writes its data. An experiment file
starts the section with :func:`task_section`; the run builds it with :func:`task_config`
and writes the data with :func:`prepare_task`. A task may also offer
``prepare_eval(run_config, out_dir) -> tuple[Path, ...]`` that writes only its held-out
files (an evaluation then reads no training data: :func:`prepare_task_eval`) and name
its family's reward (``reward``: the reward of a held-out row whose ``data_source`` has
none of its own, :func:`task_reward`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_collections


@dataclass(frozen=True)
class TaskFiles:
    """A task's data files (verl layout); ``sft`` is None for a task without demonstrations."""

    train: Path
    eval: Path | tuple[Path, ...]  # one file, or one per test set
    sft: Path | None = None


# Built-in tasks: name -> module of verltool_jax.tasks defining ``TASK_CONFIG`` (the
# dataclass of its ``task`` section) and ``write_task_from_config(run_config, out_dir)``,
# optionally ``write_eval_from_config(run_config, out_dir)`` and ``TASK_REWARD``.
# A module is imported on first use, so ``python -m verltool_jax.tasks.<module>`` runs it
# cleanly and a run imports only its own task.
BUILTIN = {
    "tiny_math": "tiny_math",
    "vt_math": "math_data",
    "search_qa": "search_qa",
    "spider": "spider",
    "quixbugs": "swe",
    "easy_vqa": "easy_vqa",
    "reasoning_gym": "reasoning_gym",
}


@dataclass(frozen=True)
class TaskSpec:
    config_cls: type
    prepare: Callable[[Any, Path], TaskFiles]
    prepare_eval: Callable[[Any, Path], tuple[Path, ...]] | None = None
    reward: str = ""  # the family's reward ("": none to fall back on)


TASKS: dict[str, TaskSpec] = {}


def register_task(
    name: str,
    config_cls: type,
    prepare: Callable[[Any, Path], TaskFiles],
    prepare_eval: Callable[[Any, Path], tuple[Path, ...]] | None = None,
    reward: str = "",
) -> None:
    """Add a task (a plugin's own, or a built-in on first use); see the module doc."""
    if not dataclasses.is_dataclass(config_cls) or "name" not in {
        f.name for f in dataclasses.fields(config_cls)
    }:
        raise TypeError(f"task {name!r}: config_cls must be a dataclass with a 'name' field")
    TASKS[name] = TaskSpec(config_cls, prepare, prepare_eval, reward)


def known_tasks() -> list[str]:
    return sorted(set(TASKS) | set(BUILTIN))


def _spec(name: str) -> TaskSpec:
    if name not in TASKS and name in BUILTIN:
        mod = importlib.import_module(f"verltool_jax.tasks.{BUILTIN[name]}")
        register_task(
            name,
            mod.TASK_CONFIG,
            mod.write_task_from_config,
            getattr(mod, "write_eval_from_config", None),
            getattr(mod, "TASK_REWARD", ""),
        )
    if name not in TASKS:
        raise ValueError(
            f"task.name={name!r} is not a known task; choose one of "
            f"{known_tasks()}, or leave task.name empty and give data.train_files"
        )
    return TASKS[name]


def task_section(name: str) -> ml_collections.ConfigDict:
    """The ``task`` section of task ``name`` with every field at its default."""
    from verltool_jax.run_config import section_dict

    return section_dict(_spec(name).config_cls(name=name))


def task_config(values: Mapping[str, Any]) -> Any:
    """The typed task section of ``values`` (``values["name"]`` picks the task);
    ValueError naming unknown keys or bad values."""
    from verltool_jax.run_config import build_section

    spec = _spec(values["name"])
    problems: list[str] = []
    cfg = build_section(spec.config_cls, values, "task.", problems)
    if problems:
        raise ValueError("; ".join(problems))
    return cfg


def prepare_task(run_config: Any, out_dir: str | os.PathLike) -> TaskFiles:
    """Write the data of ``run_config.task`` under ``out_dir``; returns its files.
    ``run_config``: a ``RunConfig`` or a config dict (validated here)."""
    from verltool_jax.run_config import RunConfig, run_config_from_dict

    if not isinstance(run_config, RunConfig):
        run_config = run_config_from_dict(run_config)
    return _spec(run_config.task.name).prepare(run_config, Path(out_dir))


def prepare_task_eval(run_config: Any, out_dir: str | os.PathLike) -> tuple[Path, ...]:
    """Write only the held-out files of ``run_config.task`` (a ``RunConfig``) under
    ``out_dir``: its ``prepare_eval``, or for a task without one everything ``prepare``
    writes, of which the held-out files are returned."""
    spec = _spec(run_config.task.name)
    if spec.prepare_eval is not None:
        return tuple(spec.prepare_eval(run_config, Path(out_dir)))
    tf = spec.prepare(run_config, Path(out_dir))
    return tf.eval if isinstance(tf.eval, tuple) else (tf.eval,)


def task_reward(name: str) -> str:
    """The reward of task ``name``'s family ("" when it names none)."""
    return _spec(name).reward
