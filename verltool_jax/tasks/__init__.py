"""Generated tasks: data written in the verl layout, selected by ``config.task.name``.

Each task registers a :class:`TaskSpec`: a frozen dataclass typing its ``task`` config
section (a ``name`` field plus the task's own knobs, with their defaults) and a
``prepare(run_config, out_dir) -> TaskFiles`` that writes its data. An experiment file
starts the section with :func:`task_section`; the run builds it with :func:`task_config`
and writes the data with :func:`prepare_task`. A task may also offer
``prepare_eval(run_config, out_dir) -> tuple[Path, ...]`` that writes only its held-out
files (an evaluation then reads no training data: :func:`prepare_task_eval`) and name
its family's reward (``reward``: the reward of a held-out row whose ``data_source`` has
none of its own, :func:`task_reward`) and its own evaluation metrics (``eval_metrics``:
``(trajectories, tokenizer) -> EvalReport`` of the greedy evaluation run,
:func:`task_eval_metrics`), so the evaluator knows no task by name.

Installed packages add tasks through the entry-point group ``verltool_jax.tasks``: the
entry point's name is the task's name and its value a module (or any object) with the
built-ins' two attributes, ``TASK_CONFIG`` and ``write_task_from_config`` (and
optionally ``write_eval_from_config``, ``TASK_REWARD`` and ``EVAL_METRICS``). They are
found by :mod:`tool_server.kit.plugins` (a clash with a built-in or between packages, or
a failed import, is a ``PluginError`` naming the package when that name is used);
``python -m verltool_jax.plugins --list-tasks`` lists them. See docs/plugins.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_collections

from tool_server.kit.plugins import PluginGroup, discover
from verltool_jax.schema import build_section, section_dict

TASKS_GROUP = "verltool_jax.tasks"  # entry-point group of tasks from installed packages


@dataclass(frozen=True)
class TaskFiles:
    """A task's data files (verl layout); ``sft`` is None for a task without demonstrations."""

    train: Path
    eval: Path | tuple[Path, ...]  # one file, or one per test set
    sft: Path | None = None


# Built-in tasks: name -> module of verltool_jax.tasks defining ``TASK_CONFIG`` (the
# dataclass of its ``task`` section) and ``write_task_from_config(run_config, out_dir)``,
# optionally ``write_eval_from_config(run_config, out_dir)``, ``TASK_REWARD`` and
# ``EVAL_METRICS``.
# A module is imported on first use, so ``python -m verltool_jax.tasks.<module>`` runs it
# cleanly and a run imports only its own task.
BUILTIN = {
    "tiny_math": "tiny_math",
    "tiny_lookup": "tiny_lookup",
    "vt_math": "math_data",
    "search_qa": "search_qa",
    "spider": "spider",
    "quixbugs": "swe",
    "easy_vqa": "easy_vqa",
    "reasoning_gym": "reasoning_gym",
    "openenv": "openenv_task",
    "verifiers": "verifiers_task",
}


@dataclass(frozen=True)
class EvalReport:
    """A task's own metrics of an evaluation's greedy run."""

    key: str  # where run_eval's result holds them (e.g. "search")
    title: str  # the console heading
    metrics: dict
    text: str  # the metrics as printed


# (trajectories of the greedy run, tokenizer) -> the task's report
EvalMetricsFn = Callable[[Sequence[Any], Any], EvalReport]


@dataclass(frozen=True)
class TaskSpec:
    config_cls: type
    prepare: Callable[[Any, Path], TaskFiles]
    prepare_eval: Callable[[Any, Path], tuple[Path, ...]] | None = None
    reward: str = ""  # the family's reward ("": none to fall back on)
    eval_metrics: EvalMetricsFn | None = None  # the task's own evaluation metrics


TASKS: dict[str, TaskSpec] = {}


def register_task(
    name: str,
    config_cls: type,
    prepare: Callable[[Any, Path], TaskFiles],
    prepare_eval: Callable[[Any, Path], tuple[Path, ...]] | None = None,
    reward: str = "",
    eval_metrics: EvalMetricsFn | None = None,
) -> None:
    """Add a task (a plugin's own, or a built-in on first use); see the module doc."""
    if not dataclasses.is_dataclass(config_cls) or "name" not in {
        f.name for f in dataclasses.fields(config_cls)
    }:
        raise TypeError(f"task {name!r}: config_cls must be a dataclass with a 'name' field")
    TASKS[name] = TaskSpec(config_cls, prepare, prepare_eval, reward, eval_metrics)


def _check_task(name: str, obj: object) -> str | None:
    """What is wrong with ``obj`` as the task of entry point ``name`` (None: nothing)."""
    cfg = getattr(obj, "TASK_CONFIG", None)
    if cfg is None or not callable(getattr(obj, "write_task_from_config", None)):
        return (
            f"points at {obj!r}, which lacks TASK_CONFIG (the task section's dataclass) "
            "or write_task_from_config(run_config, out_dir)"
        )
    if not dataclasses.is_dataclass(cfg) or "name" not in {f.name for f in dataclasses.fields(cfg)}:
        return f"has TASK_CONFIG={cfg!r}, which is not a dataclass with a 'name' field"
    return None


_PLUGINS: PluginGroup | None = None


def task_plugins(refresh: bool = False) -> PluginGroup:
    """The tasks installed packages declare (discovered once per process; ``refresh``
    reads the installed packages again)."""
    global _PLUGINS
    if _PLUGINS is None or refresh:
        _PLUGINS = discover(TASKS_GROUP, "task", BUILTIN, _check_task)
    return _PLUGINS


def known_tasks() -> list[str]:
    return sorted(set(TASKS) | set(BUILTIN) | set(task_plugins().plugins))


def _register_module(name: str, mod: Any) -> None:
    """Register task ``name`` from a module with the built-ins' attributes."""
    register_task(
        name,
        mod.TASK_CONFIG,
        mod.write_task_from_config,
        getattr(mod, "write_eval_from_config", None),
        getattr(mod, "TASK_REWARD", ""),
        getattr(mod, "EVAL_METRICS", None),
    )


def _spec(name: str) -> TaskSpec:
    plugins = task_plugins()
    if name in plugins.problems:  # a clash, or a plugin already found broken
        plugins.load(name)  # raises the PluginError naming the package
    if name not in TASKS and name in BUILTIN:
        mod = importlib.import_module(f"verltool_jax.tasks.{BUILTIN[name]}")
        _register_module(name, mod)
    if name not in TASKS and name in plugins.plugins:
        mod = plugins.load(name)  # PluginError naming the package if it cannot be used
        _register_module(name, mod)
    if name not in TASKS:
        raise ValueError(
            f"task.name={name!r} is not a known task; choose one of "
            f"{known_tasks()}, or leave task.name empty and give data.train_files"
        )
    return TASKS[name]


def task_section(name: str) -> ml_collections.ConfigDict:
    """The ``task`` section of task ``name`` with every field at its default."""
    return section_dict(_spec(name).config_cls(name=name))


def task_config(values: Mapping[str, Any]) -> Any:
    """The typed task section of ``values`` (``values["name"]`` picks the task);
    ValueError naming unknown keys or bad values."""
    spec = _spec(values["name"])
    problems: list[str] = []
    cfg = build_section(spec.config_cls, values, "task.", problems)
    if problems:
        raise ValueError("; ".join(problems))
    return cfg


def prepare_task(run_config: Any, out_dir: str | os.PathLike) -> TaskFiles:
    """Write the data of ``run_config.task`` (a validated ``RunConfig``: see
    :func:`verltool_jax.run_config.run_config_from_dict`) under ``out_dir``; returns its
    files."""
    if not dataclasses.is_dataclass(run_config):
        raise TypeError(
            "prepare_task needs a RunConfig; validate a config dict first with "
            f"verltool_jax.run_config.run_config_from_dict (got {type(run_config).__name__})"
        )
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


def task_eval_metrics(name: str) -> EvalMetricsFn | None:
    """Task ``name``'s own evaluation metrics (None when it has none)."""
    return _spec(name).eval_metrics
