"""Generated tasks (data written in the verl layout), selected by ``config.task.name``."""
from __future__ import annotations

import os

from verltool_jax.tasks import math_data, tiny_math

TASKS = {"tiny_math": tiny_math.write_task_from_config,
         "vt_math": math_data.write_task_from_config}


def prepare_task(config, out_dir: str | os.PathLike):
    """Write the data of ``config.task.name`` under ``out_dir``; returns its file paths."""
    name = config.task.name
    if name not in TASKS:
        raise ValueError(f"task.name={name!r} is not a generated task; choose one of "
                         f"{sorted(TASKS)} or give data.train_files")
    return TASKS[name](config, out_dir)
