"""``openenv``: an OpenEnv environment's episodes as prompts for our agent loop.

Each row is one episode: the task resets the environment server (``task.url``, or the
``openenv_url`` tool option) with seed ``s`` and writes its first observation as the user
message, with ``s`` in ``extra_info["openenv_seed"]``. The ``openenv`` tool
(``tool_server/tools/openenv.py``) resets the same seed at the trajectory's first action
and steps the episode with each ``<env>...</env>`` action, so the environment must give
the same episode for the same seed. Rows have data_source ``openenv``: the reward is
``env_reward``, the sum of the rewards the environment returned.

Train seeds are ``seed .. seed + num_train - 1``, held-out seeds the ``num_eval`` after
them. The config (``task_section("openenv")``) goes with ``tool_server.tools=("openenv",)``,
``rollout.action_stop_strings=("</env>",)`` and the tool options (docs/environments.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tool_server.kit.openenv import SEED_FIELD, OpenEnvSession, observation_text
from verltool_jax.data.readers import write_rows
from verltool_jax.tasks import TaskFiles

DATA_SOURCE = "openenv"
TASK_REWARD = "env_reward"
SYSTEM_PROMPT = (
    "You act in an environment. Write each action as <env>your action</env>; "
    "the environment answers with what it observes."
)


@dataclass(frozen=True)
class OpenEnvTask:
    """The ``task`` section of ``openenv``."""

    name: str = "openenv"
    url: str = ""  # the environment server; "": tool_server.tool_opt["openenv_url"]
    num_train: int = 64
    num_eval: int = 16
    seed: int = 0  # first training seed
    system_prompt: str = SYSTEM_PROMPT


def env_url(config: Any) -> str:
    """``task.url``, else the ``openenv_url`` tool option; ValueError naming both."""
    url = config.task.url or str(config.tool_server.tool_opt.get("openenv_url") or "")
    if not url:
        raise ValueError(
            "the openenv task needs the environment server: set task.url or "
            "tool_server.tool_opt.openenv_url to http://host:port"
        )
    return url


async def first_observations(url: str, seeds: list[int], obs_field: str = "") -> list[str]:
    """The first observation (as the policy reads it) of the episode of each seed, over
    one OpenEnv WebSocket session."""
    out = []
    async with OpenEnvSession(url) as env:
        for s in seeds:
            out.append(observation_text((await env.reset(seed=s)).observation, obs_field))
    return out


def make_rows(texts: list[str], seeds: list[int], split: str, system_prompt: str) -> list[dict]:
    """One verl-layout row per episode."""
    return [
        {
            "prompt": [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": text},
            ],
            "data_source": DATA_SOURCE,
            "reward_model": {"style": "environment", "ground_truth": ""},
            "extra_info": {"split": split, "index": i, SEED_FIELD: s},
        }
        for i, (text, s) in enumerate(zip(texts, seeds))
    ]


def write_task_from_config(config: Any, out_dir: str | os.PathLike) -> TaskFiles:
    """Reset the environment for every seed and write ``train`` / ``eval.parquet``."""
    t = config.task
    if t.num_train < 1 or t.num_eval < 0:
        raise ValueError(
            f"task.num_train must be >= 1 and task.num_eval >= 0, got {t.num_train}, {t.num_eval}"
        )
    obs_field = str(config.tool_server.tool_opt.get("openenv_obs_field") or "")
    train_seeds = list(range(t.seed, t.seed + t.num_train))
    eval_seeds = list(range(t.seed + t.num_train, t.seed + t.num_train + t.num_eval))
    coro = first_observations(env_url(config), train_seeds + eval_seeds, obs_field)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # callable inside a running loop too
        texts = pool.submit(asyncio.run, coro).result()
    out = Path(out_dir)
    return TaskFiles(
        train=write_rows(
            make_rows(texts[: t.num_train], train_seeds, "train", t.system_prompt),
            out / "train.parquet",
        ),
        eval=write_rows(
            make_rows(texts[t.num_train :], eval_seeds, "eval", t.system_prompt),
            out / "eval.parquet",
        ),
    )


TASK_CONFIG = OpenEnvTask
