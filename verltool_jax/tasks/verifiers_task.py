"""``verifiers``: a verifiers environment (the ``verifiers`` package, 0.4's ``verifiers.v1``
API) trained on through the gateway.

verifiers cannot be installed next to our pins (it needs ``openai<3`` and ``mcp==2.0.0``),
so it lives in its own virtual environment, ``.venv-verifiers`` (scripts/setup.sh builds
it from requirements-verifiers.txt; ``$VTJ_VERIFIERS_PYTHON`` names another python), and
we run it as a subprocess (``verifiers_runner.py``):

* the task's rows are the first ``num_train`` tasks of the taskset (then ``num_eval``
  held-out ones): each verifiers task's system prompt and prompt as our chat prompt,
  data_source ``verifiers``, the taskset and the task's index in ``extra_info``;
* the agent program (``gateway.agent = "verltool_jax.tasks.verifiers_task:rollout"``)
  plays one episode of the row's task with verifiers' own machinery (its environment,
  its chat program, its interception server), every model call going to the
  trajectory's gateway endpoint (``verltool_jax.gateway.command``), and returns the
  score of the taskset's rubric, the trained reward with ``gateway.reward = "program"``.

Config: ``task.taskset`` (the taskset's id, i.e. its module's name), ``task.path`` (a
folder to import it from; "" for an installed package) and ``task.taskset_args`` (its
config's fields as JSON). ``configs/tiny_math.py:verifiers`` trains the tiny model on
``examples/verifiers_env/vtj_multiply.py``. docs/environments.md.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verltool_jax.data.readers import write_rows
from verltool_jax.gateway.command import run_command
from verltool_jax.tasks import TaskFiles

DATA_SOURCE = "verifiers"
TASK_REWARD = "program_reward"
REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("verifiers_runner.py")
VENV_PYTHON = REPO / ".venv-verifiers" / "bin" / "python"
PYTHON_VAR = "VTJ_VERIFIERS_PYTHON"


@dataclass(frozen=True)
class VerifiersTask:
    """The ``task`` section of ``verifiers``."""

    name: str = "verifiers"
    taskset: str = "vtj_multiply"  # the verifiers taskset's id (its module's name)
    path: str = "examples/verifiers_env"  # a folder to import it from ("": installed)
    taskset_args: str = "{}"  # its config's fields, as a JSON object
    num_train: int = 64
    num_eval: int = 16


def verifiers_python() -> str:
    """The verifiers environment's python; FileNotFoundError naming scripts/setup.sh."""
    py = Path(os.environ.get(PYTHON_VAR) or VENV_PYTHON)
    if not py.is_file():
        raise FileNotFoundError(
            f"the verifiers environment's python {py} is missing: bash scripts/setup.sh "
            f"builds .venv-verifiers from requirements-verifiers.txt (or set {PYTHON_VAR})"
        )
    return str(py)


def taskset_folder(path: str) -> str:
    """``task.path`` as an absolute folder: relative to the working directory, else to
    the repository (so the configs' ``examples/...`` work from anywhere); "" stays ""."""
    if not path:
        return ""
    p = Path(path)
    if not p.is_absolute() and not p.exists() and (REPO / p).exists():
        p = REPO / p
    return str(p.resolve())


def runner_command(command: str, taskset: str, path: str, taskset_args: str) -> list[str]:
    """The runner's command line (``-P``: our tasks folder stays off its import path)."""
    cmd = [verifiers_python(), "-P", str(RUNNER), command, "--taskset", taskset]
    if path:
        cmd += ["--path", taskset_folder(path)]
    return cmd + ["--args", taskset_args]


def load_rows(t: VerifiersTask, num: int) -> list[dict]:
    """The first ``num`` tasks of the taskset (``verifiers_runner.rows``)."""
    try:
        json.loads(t.taskset_args)
    except ValueError as e:
        raise ValueError(f"task.taskset_args={t.taskset_args!r} is not JSON: {e}") from None
    cmd = runner_command("rows", t.taskset, t.path, t.taskset_args) + ["--num", str(num)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(
            f"cannot load the verifiers taskset {t.taskset!r} (task.path={t.path!r}): "
            f"{done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def make_row(task: dict, index: int, split: str, t: VerifiersTask) -> dict:
    """One verl-layout row of a verifiers task (``verifiers_runner.rows``' output)."""
    prompt = task["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if task.get("system_prompt"):
        messages = [{"role": "system", "content": task["system_prompt"]}, *messages]
    return {
        "prompt": messages,
        "data_source": DATA_SOURCE,
        "reward_model": {"style": "program", "ground_truth": ""},
        "extra_info": {
            "split": split,
            "index": index,
            "verifiers_idx": task["idx"],
            "verifiers_id": task.get("id") or "",
            "verifiers_taskset": t.taskset,
            "verifiers_path": taskset_folder(t.path),
            "verifiers_args": t.taskset_args,
        },
    }


def write_task_from_config(config: Any, out_dir: str | os.PathLike) -> TaskFiles:
    """Load the taskset in the verifiers environment and write ``train`` / ``eval.parquet``."""
    t = config.task
    if t.num_train < 1 or t.num_eval < 0:
        raise ValueError(
            f"task.num_train must be >= 1 and task.num_eval >= 0, got {t.num_train}, {t.num_eval}"
        )
    tasks = load_rows(t, t.num_train + t.num_eval)
    if len(tasks) < t.num_train + t.num_eval:
        raise ValueError(
            f"the verifiers taskset {t.taskset!r} has {len(tasks)} tasks, fewer than "
            f"task.num_train + task.num_eval = {t.num_train + t.num_eval}"
        )
    out = Path(out_dir)
    train = [make_row(x, i, "train", t) for i, x in enumerate(tasks[: t.num_train])]
    held = [make_row(x, i, "eval", t) for i, x in enumerate(tasks[t.num_train :])]
    return TaskFiles(
        train=write_rows(train, out / "train.parquet"), eval=write_rows(held, out / "eval.parquet")
    )


async def rollout(
    base_url: str,
    data: dict,
    timeout_s: float = 600.0,
    max_turns: int | None = None,
    model: str = "policy",
) -> float | None:
    """The agent program (module doc): one verifiers episode of the row's task against
    ``base_url``; the rubric's reward. ``max_turns`` caps its model calls (verifiers'
    ``max_turns``; None: the harness's own end, a reply without a tool call)."""
    info = data.get("extra_info") or {}
    if "verifiers_idx" not in info:
        raise ValueError("the data row is not a verifiers task's (no extra_info.verifiers_idx)")
    cmd = runner_command(
        "episode", info["verifiers_taskset"], info["verifiers_path"], info["verifiers_args"]
    )
    cmd += ["--model", model] + ([] if max_turns is None else ["--max-turns", str(max_turns)])
    return await run_command(base_url, data, cmd, timeout_s=timeout_s, model=model)


TASK_CONFIG = VerifiersTask
