"""A verifiers environment trained on through the gateway (``verltool_jax/tasks/verifiers_task.py``):
verifiers runs in its own virtual environment (``.venv-verifiers``, built by
scripts/setup.sh) as the agent program of each trajectory, plays one episode of the
row's task with its own machinery against the trajectory's gateway endpoint, and returns
its rubric's score.

The taskset here (``tests/support/verifiers_envs/vtj_reply_length.py``) scores every
character of the reply, so the checks are exact: the reward of each trajectory is the
rubric's score of precisely the text the gateway recorded for it. Then the real trainer
runs an RL step of ``configs/tiny_math.py:verifiers,smoke`` on that taskset and ends
with exact data accounting."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from support.rollout_fixtures import keyed_items
from support.smoke_run import REPO
from support.verifiers_envs.reply_scores import rubric

from verltool_jax.gateway import Gateway, GatewayConfig
from verltool_jax.gateway.producer import GatewayProducer
from verltool_jax.gateway.program import bind_agent
from verltool_jax.rollout.agent_loop import PromptItem
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.trajectory import load_trajectories
from verltool_jax.tasks import verifiers_task as vt

ENVS = Path(__file__).parents[1] / "support" / "verifiers_envs"
TASKSET = vt.VerifiersTask(
    taskset="vtj_reply_length", path=str(ENVS), taskset_args='{"num_tasks": 8}', num_eval=2
)


def reply_text(t, tokenizer) -> str:
    """The model's reply as verifiers read it: the sampled tokens without the end of
    sequence (the gateway's reply text), stripped (``Trace.last_reply``)."""
    ids = [i for i, m in zip(t.response_ids, t.loss_mask) if m]
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False).strip()


def test_rows_come_from_the_taskset_and_errors_name_the_fix(monkeypatch, tmp_path):
    rows = vt.load_rows(TASKSET, 3)
    assert [r["idx"] for r in rows] == [0, 1, 2]
    row = vt.make_row(rows[1], 1, "train", TASKSET)
    assert row["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 1?"},
    ]
    assert row["data_source"] == "verifiers" and row["extra_info"]["verifiers_idx"] == 1

    with pytest.raises(RuntimeError, match="cannot load the verifiers taskset 'no_such'"):
        vt.load_rows(vt.VerifiersTask(taskset="no_such", path=str(ENVS)), 1)
    monkeypatch.setenv(vt.PYTHON_VAR, str(tmp_path / "missing" / "python"))
    with pytest.raises(FileNotFoundError, match="scripts/setup.sh"):
        vt.load_rows(TASKSET, 1)
    with pytest.raises(FileNotFoundError, match="scripts/setup.sh"):
        asyncio.run(vt.rollout("http://127.0.0.1:9/t/k/v1", row))


def test_a_verifiers_episode_through_the_gateway_gets_its_rubric_reward(
    sampler_flax_model, sampler_tokenizer
):
    from verltool_jax.samplers.jax_sampler import JAXSampler

    rows = [vt.make_row(x, i, "train", TASKSET) for i, x in enumerate(vt.load_rows(TASKSET, 1))]
    items = [PromptItem([], row, f"g{i}") for i, row in enumerate(rows)]
    sampler = JAXSampler(sampler_flax_model, sampler_tokenizer, max_model_len=512, max_batch_size=4)

    async def main():
        cfg = GatewayConfig(max_model_len=512, default_max_tokens=24)
        gw = Gateway(sampler, sampler_tokenizer, cfg)
        await gw.start()
        try:
            agent = bind_agent(vt.rollout, "", {"max_turns": 1})
            prod = GatewayProducer(
                keyed_items(items), gateway=gw, agent=agent, n_samples=2, cfg=RolloutConfig()
            )
            return await asyncio.gather(*(prod._group(it) for it in items)), dict(gw.stats)
        finally:
            await gw.stop()

    try:
        groups, stats = asyncio.run(main())
    finally:
        sampler.close()
    trajs = [t for g in groups for t in g]
    assert len(trajs) == 2 and stats.get("agent_failed", 0) == 0, [t.error for t in trajs]
    for t in trajs:
        t.check()
        assert t.termination != "error" and sum(t.loss_mask) > 0
        assert t.reward == t.reward_info["program_reward"]
        assert t.reward == pytest.approx(rubric(reply_text(t, sampler_tokenizer)), abs=1e-9)
    assert len({t.reward for t in trajs}) > 1  # the rubric tells the replies apart


def test_an_rl_step_on_a_verifiers_environment_with_exact_accounting(tmp_path):
    from transformers import AutoTokenizer

    from verltool_jax.cli import load_config
    from verltool_jax.train.trainer import train

    steps, groups = 1, 2
    out = tmp_path / "run"
    c = load_config(str(REPO / "configs/tiny_math.py") + ":verifiers,smoke", lock=False)
    c.task.taskset, c.task.path = TASKSET.taskset, TASKSET.path
    c.task.taskset_args, c.task.num_train, c.task.num_eval = '{"num_tasks": 10}', 8, 2
    c.sampler.backend = "jax"
    c.trainer.out_dir, c.trainer.steps, c.trainer.ckpt_every = str(out), steps, 0
    c.trainer.batch_groups = groups
    c.logging.progress_bar = c.logging.plot = c.logging.tensorboard = False
    c.logging.dump_trajectories = True
    c.data.max_eval_examples = 0
    result = train(c, echo=False)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps and not summary["interrupted"]
    data = summary["data"]
    assert data == result.summary.data and data["ok"], data
    assert data["trained"] + data["no_signal"] == steps * groups, data
    assert data["trained"] + data["no_signal"] + data["in_flight"] == data["drawn"], data
    assert not (data["lost"] or data["twice"] or data["unknown"] or data["unusable"]), data

    tok = AutoTokenizer.from_pretrained(out / "init_model")
    trained = [load_trajectories(p) for p in sorted((out / "trained").glob("step_*.jsonl"))]
    assert len(trained) == steps
    trajs = [t for step in trained for t in step]
    assert len({t.group_id for t in trajs}) == data["trained"]
    assert trajs and all(t.termination != "error" for t in trajs)
    for t in trajs:  # trained with the rubric's score of the recorded reply
        assert t.reward == t.reward_info["program_reward"]
        assert t.reward == pytest.approx(rubric(reply_text(t, tok)), abs=1e-9)
    assert np.isfinite([t.reward for t in trajs]).all()
