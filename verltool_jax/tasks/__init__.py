"""Task data (written in the verl layout), selected by ``config.task.name``.

Each entry of :data:`TASKS` is ``write_task_from_config(config, out_dir)`` of its module,
imported on first use (so ``python -m verltool_jax.tasks.<module>`` runs its module
cleanly).
"""
from __future__ import annotations

import importlib
import os

_MODULES = {"tiny_math": "tiny_math", "spider": "spider", "quixbugs": "swe"}


def _writer(module: str):
    def write_task_from_config(config, out_dir: str | os.PathLike):
        mod = importlib.import_module(f"verltool_jax.tasks.{module}")
        return mod.write_task_from_config(config, out_dir)
    write_task_from_config.__qualname__ = f"{module}.write_task_from_config"
    return write_task_from_config


TASKS = {name: _writer(module) for name, module in _MODULES.items()}


def prepare_task(config, out_dir: str | os.PathLike):
    """Write the data of ``config.task.name`` under ``out_dir``; returns its file paths."""
    name = config.task.name
    if name not in TASKS:
        raise ValueError(f"task.name={name!r} is not a generated task; choose one of "
                         f"{sorted(TASKS)} or give data.train_files")
    return TASKS[name](config, out_dir)
