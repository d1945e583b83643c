"""The real trainer on an OpenEnv environment: the tiny policy (JAX sampler), the
``openenv`` task's prompts, the trainer's own tool server with the ``openenv`` tool
stepping the environment (served by OpenEnv's own server), ``env_reward`` as the reward.
The untrained tiny policy rarely writes an ``<env>`` action, so this checks the wiring
(the run trains on the environment's groups), not learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.asgi_server import serve_app
from support.openenv_envs import word_env_app
from support.smoke_run import REPO

from verltool_jax.cli import load_config
from verltool_jax.tasks import task_section


@pytest.mark.slow  # a whole run (JIT of the train step and the sampler): minutes on 2 cores
def test_two_rl_steps_on_an_openenv_environment(tmp_path):
    from verltool_jax.train.trainer import train

    out = tmp_path / "run"
    with serve_app(word_env_app()) as env_url:
        c = load_config(str(REPO / "configs/tiny_math.py") + ":smoke", lock=False)
        c.task = task_section("openenv")
        c.task.num_train, c.task.num_eval = 8, 2
        c.tool_server.tools = ("openenv",)
        c.tool_server.tool_opt = {"openenv_url": env_url, "openenv_obs_field": "prompt"}
        c.rollout.action_stop_strings = ("</env>",)
        c.sampler.backend = "jax"
        c.sft.steps = 0
        c.trainer.out_dir, c.trainer.steps = str(out), 2
        c.logging.progress_bar = c.logging.plot = c.logging.tensorboard = False
        c.data.max_eval_examples = 0
        summary = train(c, echo=False).summary
    assert summary.steps == 2
    rows = [json.loads(x) for x in Path(out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "policy/version" in r]
    assert [r["step"] for r in rl] == [1, 2]
    assert all("reward/mean" in r for r in rl)
    assert sorted(p.name for p in (out / "data").glob("*.parquet")) == [
        "eval.parquet",
        "train.parquet",
    ]
