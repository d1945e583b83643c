"""The real trainer on an OpenEnv environment: the tiny policy (JAX sampler), the
``openenv`` task's prompts, the trainer's own tool server with the ``openenv`` tool
stepping the environment (OpenEnv's own server on a real uvicorn), ``env_reward`` as the
reward. A short SFT warm start on ``<env>word</env>`` demonstrations makes the policy
act in the environment, so the RL steps train on episodes the environment stepped and
scored. Checked: the run finishes, its data accounting is exact (and agrees with the
trained trajectories), and every trained reward is the environment's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from support.asgi_server import serve_app
from support.openenv_envs import target_of, word_env_app
from support.smoke_run import REPO

from verltool_jax.cli import load_config
from verltool_jax.data.readers import write_rows
from verltool_jax.rollout.trajectory import load_trajectories
from verltool_jax.tasks import task_section
from verltool_jax.tasks.openenv_task import make_rows

STEPS, GROUPS = 3, 2
SYSTEM = "Act as <env>word</env>."  # short: the smoke config's prompt budget is 96 tokens


def demonstrations(path: Path, seeds: list[int]) -> str:
    """SFT rows: the task's prompt for each seed, the right word as the action, the
    environment's answer (not trained on)."""
    rows = make_rows([f"Say the word {target_of(s)}." for s in seeds], seeds, "train", SYSTEM)
    for r, s in zip(rows, seeds):
        r["response_segments"] = [
            {"text": f"<env>{target_of(s)}</env>", "loss": True},
            {"text": "right", "loss": False, "observation": True},
        ]
    return str(write_rows(rows, path))


# a whole run (SFT, JIT of the train step and the sampler): about 70 s on 2 cores
def test_rl_steps_on_an_openenv_environment_finish_with_exact_accounting(tmp_path):
    from verltool_jax.train.trainer import train

    out = tmp_path / "run"
    with serve_app(word_env_app()) as env_url:
        c = load_config(str(REPO / "configs/tiny_math.py") + ":smoke", lock=False)
        c.task = task_section("openenv")
        c.task.num_train, c.task.num_eval, c.task.seed = 16, 2, 0
        c.task.system_prompt = SYSTEM
        c.tool_server.tools = ("openenv",)
        c.tool_server.tool_opt = {"openenv_url": env_url, "openenv_obs_field": "prompt"}
        c.rollout.action_stop_strings = ("</env>",)
        c.rollout.max_turns = 2
        c.rollout.n_samples = 4
        c.sampler.backend = "jax"
        c.sft.files = (demonstrations(tmp_path / "sft.parquet", list(range(16))),)
        c.sft.steps, c.sft.batch_size, c.sft.lr = 24, 8, 3e-3
        c.trainer.out_dir, c.trainer.steps = str(out), STEPS
        c.trainer.batch_groups, c.trainer.ckpt_every = GROUPS, 0
        c.algo.mini_batch_size = c.algo.micro_batch_size = 8
        c.logging.progress_bar = c.logging.plot = c.logging.tensorboard = False
        c.logging.dump_trajectories = True
        c.data.max_eval_examples = 0
        result = train(c, echo=False)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and not summary["interrupted"]
    data = summary["data"]
    assert data == result.summary.data and data["ok"], data
    assert data["trained"] + data["no_signal"] == STEPS * GROUPS, data
    assert data["trained"] + data["no_signal"] + data["in_flight"] == data["drawn"], data
    assert not (data["lost"] or data["twice"] or data["unknown"] or data["unusable"]), data

    # independently, from the trajectories each step trained on
    trained = [load_trajectories(p) for p in sorted((out / "trained").glob("step_*.jsonl"))]
    assert len(trained) == STEPS
    groups = [t.group_id for step in trained for t in step]
    assert len(set(groups)) == data["trained"]
    rows = [int(re.fullmatch(r"[sr]\d+-(\d+)(\.a\d+)?", g).group(1)) for g in set(groups)]
    assert len(rows) == len(set(rows))  # no prompt trained twice
    trajs = [t for step in trained for t in step]
    assert all(t.reward_info["reward_name"] == "env_reward" for t in trajs)
    # (an action the tool could not parse, e.g. ``</env>`` without ``<env>``, is invalid:
    # no step, empty observation, reward 0)
    acted = [t for t in trajs if t.tool_calls > t.invalid_tool_calls]
    assert acted, "the warm-started policy never acted in the environment"
    for t in acted:  # what the environment said is what the trajectory was scored on
        assert set(t.observations) <= {"right", "wrong, try again"}, t.observations
        solved = "right" in t.observations
        assert t.reward == (1.0 if solved else 0.0)
        assert t.termination == "done" or not solved  # the environment ended the episode
    acted_ids = {id(t) for t in acted}
    assert all(t.reward == 0.0 for t in trajs if id(t) not in acted_ids)
