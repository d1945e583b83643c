"""Fixtures of the rollout tests (a pytest plugin; loaded by the rollout test files)."""

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def keyed_items(items):
    """A finite list of prompts as the ``(position, item)`` pairs ``RolloutProducer``
    takes (production feeds it from the prompt pipeline instead)."""
    return iter(enumerate(items))


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    """The tiny project tokenizer (byte-level BPE with atomic markup tokens, ChatML)."""
    from verltool_jax.models.tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("rollout_tok"))


def _run_server():
    from tool_server.launcher import run_server

    return run_server


@pytest.fixture(scope="session")
def tool_url():
    """A real tool server with python_code, sql and the sleep_search experiment tool.

    sleep_search latencies here are ~20 ms (lognormal), so tests stay fast.
    """
    with _run_server()(
        tools=["python_code", "sleep_search", "sql"],
        timeout=5.0,
        tool_opt={"sleep_search_mean_s": 0.02, "sleep_search_sigma": 0.5},
    ) as url:
        yield url


@pytest.fixture(scope="session")
def slow_tool_url():
    """A real tool server whose sleep_search takes ~3 s, with a 1 s server-side timeout."""
    with _run_server()(
        tools=["sleep_search"],
        timeout=1.0,
        tool_opt={"sleep_search_mean_s": 3.0, "sleep_search_sigma": 0.01},
    ) as url:
        yield url
