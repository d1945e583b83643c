"""tiny_math served as an OpenEnv environment (``verltool_jax/environments/openenv_server.py``)
and driven by OpenEnv's own clients over a real uvicorn server, with our real sandboxed
tool server running the python calls and our math reward scoring the answers."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from openenv.core.generic_client import GenericEnvClient
from support.asgi_server import serve_app

from verltool_jax.cli import parse_command_line
from verltool_jax.environments.openenv_server import (
    TaskAction,
    TaskEnvClient,
    is_tool_call,
    main,
    make_app,
    task_settings,
)

CONFIG = str(Path(__file__).parents[2] / "configs" / "tiny_math.py") + ":smoke"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(url, settings)``: tiny_math's held-out rows behind a real OpenEnv server."""
    cfg = parse_command_line(
        ["--config", CONFIG, "--config.rollout.max_turns=2", "--config.tool_server.timeout_s=10"]
    ).config
    with task_settings(cfg, "eval", tmp_path_factory.mktemp("openenv_data")) as settings:
        with serve_app(make_app(settings, max_concurrent_envs=4)) as url:
            yield url, settings


def _product(row: dict) -> tuple[int, int]:
    return row["extra_info"]["a"], row["extra_info"]["b"]


async def test_typed_client_plays_an_episode_with_a_tool_call_and_is_scored(served):
    url, settings = served
    row = settings.rows[3]
    a, b = _product(row)
    async with TaskEnvClient(base_url=url) as env:
        first = await env.reset(index=3)
        assert first.observation.messages == row["prompt"]
        assert first.observation.text == f"What is {a} * {b}?"
        assert "</python>" in first.observation.action_stop_strings
        assert not first.done

        tool = await env.step(TaskAction(text=f"<python>print({a} * {b})</python>"))
        assert not tool.done and tool.reward is None
        assert tool.observation.valid
        assert tool.observation.text == f"{a * b}\n"  # the sandboxed python tool's stdout
        assert tool.observation.formatted == settings.obs_template.format(obs=f"{a * b}\n")
        state = await env.state()
        assert state.tool_calls == 1 and state.row_index == 3 and not state.finished

        end = await env.step(TaskAction(text=f"<answer>{a * b}</answer>"))
        assert end.done and end.reward == 1.0 and end.observation.correct is True
        assert end.observation.info["reward_info"]["reward_name"] == "math"

        with pytest.raises(RuntimeError, match="episode has ended"):
            await env.step(TaskAction(text="<answer>1</answer>"))

        # reset starts another episode on the same connection: a wrong answer scores 0
        again = await env.reset(index=0)
        assert not again.done
        wrong = await env.step(TaskAction(text="<answer>7</answer>"))
        assert wrong.done and wrong.reward == 0.0 and wrong.observation.correct is False


async def test_generic_client_seeded_resets_and_the_turn_limit(served):
    """OpenEnv's dict client; a seed picks the row deterministically; a tool call past
    ``rollout.max_turns`` (2 here) ends the episode without running it."""
    url, settings = served
    async with GenericEnvClient(base_url=url) as env:
        r1 = await env.reset(seed=5)
        r2 = await env.reset(seed=5)
        assert r1.observation["messages"] == r2.observation["messages"]
        s1 = await env.step({"text": "<python>print(41)</python>"})
        s2 = await env.step({"text": "<python>print(41 + 1)</python>"})
        assert (s1.done, s2.done) == (False, False)
        assert (s1.observation["text"], s2.observation["text"]) == ("41\n", "42\n")
        s3 = await env.step({"text": "<python>print(43)</python>"})
        assert s3.done and s3.reward == 0.0  # the third call is over the limit: scored
        assert s3.observation["text"] == ""  # and not run
        with pytest.raises(RuntimeError, match="out of range"):
            await env.reset(index=len(settings.rows))


async def test_sessions_are_independent(served):
    """Two connections at once are two episodes, each on its own row to its own end."""
    url, settings = served

    async def episode(index: int) -> tuple[str, float | None]:
        a, b = _product(settings.rows[index])
        async with GenericEnvClient(base_url=url) as env:
            first = await env.reset(index=index)
            tool = await env.step({"text": f"<python>print({a} * {b})</python>"})
            end = await env.step({"text": f"<answer>{tool.observation['text'].strip()}</answer>"})
            return first.observation["text"], end.reward

    (q1, r1), (q2, r2) = await asyncio.gather(episode(1), episode(2))
    assert q1 != q2 and (r1, r2) == (1.0, 1.0)


def test_tool_call_detection_and_bad_command_line():
    stops = ("</python>", "</answer>")
    assert is_tool_call("<python>print(1)</python>\n", stops)
    assert not is_tool_call("the answer is 3", stops)
    assert main(["--config", CONFIG, "--port=notanumber"]) == 2
    assert main(["--port=1"]) == 2  # no --config


def test_a_missing_openenv_names_the_extra(monkeypatch):
    from verltool_jax.environments import require_openenv

    monkeypatch.setitem(sys.modules, "openenv.core", None)  # as if not installed
    with pytest.raises(ImportError, match=r"verltool-jax\[openenv\]"):
        require_openenv()
