"""An OpenEnv environment (written here, served by OpenEnv's own server on a real uvicorn)
driven by our agent loop: the ``openenv`` task writes its episodes' first observations as
prompts, the ``openenv`` tool on our real tool server steps the episodes, ``env_reward``
turns the environment's rewards into the trajectories' rewards, and the trainer makes
its batch of them."""

from __future__ import annotations

import asyncio

import pytest
from support.asgi_server import serve_app
from support.openenv_envs import target_of, word_env_app
from support.scripted_sampler import ScriptedSampler
from support.smoke_run import REPO

from tool_server.client import ToolClient
from tool_server.kit.openenv import OpenEnvError, OpenEnvSession, observation_text
from tool_server.launcher import run_server
from verltool_jax.data.readers import read_rows
from verltool_jax.data.templating import prompt_token_ids
from verltool_jax.rewards.compute import RewardPool, assign_rewards
from verltool_jax.rewards.env_reward import episode_return
from verltool_jax.rollout.agent_loop import PromptItem, run_rollout
from verltool_jax.run_config import default_config_dict, run_config_from_dict
from verltool_jax.tasks import prepare_task, task_section
from verltool_jax.train.batch import make_batch

TOOL_OPT = {"openenv_obs_field": "prompt"}


@pytest.fixture(scope="module")
def env_url():
    with serve_app(word_env_app()) as url:
        yield url


@pytest.fixture(scope="module")
def openenv_tool_url(env_url):
    with run_server(["openenv"], timeout=10.0, tool_opt={**TOOL_OPT, "openenv_url": env_url}) as u:
        yield u


def run_config(env_url: str, tool_url: str):
    c = default_config_dict()
    c.task = task_section("openenv")
    c.task.num_train, c.task.num_eval, c.task.seed = 4, 2, 10
    c.tool_server.url = tool_url
    c.tool_server.tools = ("openenv",)
    c.tool_server.tool_opt = {**TOOL_OPT, "openenv_url": env_url}
    c.rollout.action_stop_strings = ("</env>",)
    c.rollout.n_samples, c.rollout.max_turns, c.rollout.max_response_tokens = 2, 3, 160
    c.reward.num_workers = 0
    c.algo.mini_batch_size = c.algo.micro_batch_size = 4
    return run_config_from_dict(c)


def test_agent_loop_plays_openenv_episodes_and_the_batch_trains_on_their_rewards(
    env_url, openenv_tool_url, tok, tmp_path
):
    rc = run_config(env_url, openenv_tool_url)
    files = prepare_task(rc, tmp_path)
    rows = read_rows(files.train)
    seeds = [r["extra_info"]["openenv_seed"] for r in rows]
    assert seeds == [10, 11, 12, 13]
    assert [r["prompt"][-1]["content"] for r in rows] == [
        f"Say the word {target_of(s)}." for s in seeds
    ]
    assert [r["extra_info"]["openenv_seed"] for r in read_rows(files.eval)] == [14, 15]

    def script(rid: str, turn: int) -> str:
        """Sample 0 says the word; sample 1 says a wrong one, then stops (EOS)."""
        seed, k = (int(x) for x in rid[1:].split("-"))
        if k == 0:
            return f"<env>{target_of(seed)}</env>"
        return "<env>nope</env>" if turn == 0 else "I give up."

    items = [
        PromptItem(prompt_token_ids(tok, r["prompt"]), r, f"s{s}") for r, s in zip(rows, seeds)
    ]

    async def roll():
        async with ToolClient(openenv_tool_url) as client:
            return await run_rollout(
                items, 2, ScriptedSampler(tok, script), client, tok, rc.rollout
            )

    trajs = [t for group in asyncio.run(roll()) for t in group]
    right = [t for t in trajs if t.trajectory_id.endswith("-0")]
    wrong = [t for t in trajs if t.trajectory_id.endswith("-1")]
    assert all(t.termination == "done" and t.tool_calls == 1 for t in right)  # env said done
    assert all(t.termination == "eos" and t.tool_calls == 1 for t in wrong)
    assert all(t.observations == ["right"] for t in right)
    assert all(t.observations == ["wrong, try again"] for t in wrong)

    with RewardPool(num_workers=0) as pool:
        assign_rewards(trajs, pool.score(trajs, tok))
    assert [t.reward for t in right] == [1.0] * 4 and [t.reward for t in wrong] == [0.0] * 4
    assert all(t.reward_info["reward_name"] == "env_reward" for t in trajs)

    batch = make_batch(rc, rc.algo, trajs, pad_id=tok.pad_token_id)
    assert batch is not None and len(batch.trajectories) == 8
    adv = {t.trajectory_id: a for t, a in zip(batch.trajectories, batch.arrays["advantages"])}
    assert all(adv[t.trajectory_id].max() > 0 for t in right)  # GRPO: right above its group
    assert all(adv[t.trajectory_id].min() < 0 for t in wrong)


async def test_protocol_session_errors_and_observation_text(env_url):
    """Our client of OpenEnv's protocol against OpenEnv's server: an action the
    environment's schema rejects is an OpenEnvError naming the field; episodes run."""
    async with OpenEnvSession(env_url, timeout_s=10) as env:
        first = await env.reset(seed=3)
        assert first.observation == {"prompt": f"Say the word {target_of(3)}."}
        assert (first.reward, first.done) == (None, False)
        with pytest.raises(OpenEnvError, match="message"):
            await env.step({"text": "w1"})  # WordAction's field is "message"
        end = await env.step({"message": target_of(3)})
        assert (end.reward, end.done, end.observation["prompt"]) == (1.0, True, "right")
    assert observation_text({"b": [1], "a": "x"}) == '{"a": "x", "b": [1]}'
    assert observation_text({"b": [1], "a": "x"}, "b") == "[1]"
    with pytest.raises(KeyError, match="openenv_obs_field"):
        observation_text({"a": "x"}, "c")
    with pytest.raises(ConnectionError, match="cannot reach"):
        await OpenEnvSession("http://127.0.0.1:9", timeout_s=2).open()


def test_episode_return_and_a_tool_without_its_server(tmp_path):
    assert episode_return([0.0, 0.5, 1.0]) == 1.5
    with pytest.raises(ValueError, match="non-finite"):
        episode_return([float("nan")])
    # no openenv_url: the server refuses to start and says what to set
    with pytest.raises(RuntimeError, match="openenv_url=http://host:port"):
        with run_server(["openenv"], timeout=5.0):
            pass


async def test_the_example_guess_number_environment_answers_higher_lower_right():
    """``examples/openenv_env/guess_number.py`` (the SmolLM2 experiment's environment) under
    OpenEnv's own server: the seed fixes the number, guesses are answered, the episode
    ends on the right number (reward 1) or after its last guess (reward 0)."""
    import importlib.util

    path = REPO / "examples/openenv_env/guess_number.py"
    spec = importlib.util.spec_from_file_location("guess_number", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    n = mod.number_of(5)
    with serve_app(mod.app()) as url:
        async with OpenEnvSession(url, timeout_s=10) as env:
            first = await env.reset(seed=5)
            assert "from 1 to 10" in first.observation["prompt"] and not first.done
            low = await env.step({"message": str(n - 1)})
            assert low.observation["prompt"] == "higher"
            assert (low.reward, low.done) == (0.0, False)
            bad = await env.step({"message": "five"})
            assert bad.observation["prompt"].startswith("not a whole number") and not bad.done
            end = await env.step({"message": f" {n} "})
            assert (end.observation["prompt"], end.reward, end.done) == ("right", 1.0, True)
        async with OpenEnvSession(url, timeout_s=10) as env:  # four wrong guesses end it
            await env.reset(seed=5)
            wrong = str(n % 10 + 1)
            steps = [await env.step({"message": wrong}) for _ in range(4)]
            assert [s.done for s in steps] == [False, False, False, True]
            assert all(s.reward == 0.0 for s in steps)
