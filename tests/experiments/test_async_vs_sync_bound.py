"""The lower bound of experiments/async_vs_sync.py, on hand-made trajectories."""

import importlib.util
import random
from pathlib import Path

import pytest

from verltool_jax.rollout.trajectory import Trajectory

_PATH = Path(__file__).resolve().parents[2] / "experiments" / "async_vs_sync.py"


@pytest.fixture(scope="module")
def exp():
    spec = importlib.util.spec_from_file_location("async_vs_sync", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _traj(tid, gen_tokens, tool_latencies, drawn, actions):
    t = Trajectory(trajectory_id=tid, group_id="g", prompt_ids=[1])
    t.gen_tokens = list(gen_tokens)
    t.tool_latencies = list(tool_latencies)
    t.actions = list(actions)
    # the server reports a sleep_search draw as metrics.latency_s, tagged with the turn
    t.extras = [{"turn": turn, "metrics": {"latency_s": lat}} for turn, lat in drawn.items()]
    return t


def test_alone_latencies_use_the_draw_for_search_and_the_faster_python_time(exp):
    # call 0 follows turn 1 (search, drew 2.0 s, took 2.3 s in the batch);
    # call 1 follows turn 2 (python: 0.5 s in the batch, 0.004 s alone)
    t = _traj("a", [10, 10, 5], [2.3, 0.5], {1: 2.0}, ["<search>q</search>", "<python>1</python>"])
    assert exp.alone_tool_latencies(t, 0.004) == [2.0, 0.004]
    # a python call that was faster in the batch than the probe keeps its own time
    t2 = _traj("b", [4, 4], [0.001], {}, ["<python>1</python>"])
    assert exp.alone_tool_latencies(t2, 0.004) == [0.001]


def test_lower_bound_is_the_larger_of_slowest_serial_and_generation_work(exp):
    a, b = 0.002, 0.001  # t(n) = 2 ms + 1 ms * n
    slow = _traj("slow", [10, 20], [3.0], {1: 2.5}, ["<search>q</search>"])
    busy = _traj(
        "busy", [100, 100, 100], [0.2, 0.2], {}, ["<python>1</python>", "<python>2</python>"]
    )
    bound, serial, work = exp.lower_bound([slow, busy], 100.0, a, b, 0.01)
    serial_slow = 2.5 + (a + b * 10) + (a + b * 20)
    serial_busy = 0.01 + 0.01 + 3 * (a + b * 100)
    assert serial == pytest.approx(max(serial_slow, serial_busy))
    assert work == pytest.approx(330 / 100.0)  # all tokens at 100 tok/s
    assert bound == pytest.approx(max(serial, work)) and bound == pytest.approx(3.3)
    assert exp.python_calls([slow, busy]) == 2


def test_prompts_end_with_the_requested_tool(exp):
    rng = random.Random(0)
    for tool in ("python", "search"):
        q = exp.question(rng, tool)
        assert q.endswith(f"Use {tool}.")
        episode = exp.transcript(rng, tool)
        other = "search" if tool == "python" else "python"
        assert f"<{tool}>" in episode and f"<{other}>" not in episode
    assert set(exp.PROFILE_TOOLS) == {"python", "search", "mix"}
    assert exp.PROFILE_TOOLS["python"] == ["python_code"]


def test_heavy_tail_lengths_are_pareto_and_seeded_by_the_trajectory(exp):
    n = [exp.pareto_tokens(0, f"t{i}", 1.1, 16, 768) for i in range(4000)]
    assert n == [exp.pareto_tokens(0, f"t{i}", 1.1, 16, 768) for i in range(4000)]
    assert min(n) >= 16 and max(n) == 768
    # P(L >= x) = (16 / x) ** 1.1: half the draws under 30 tokens, ~1.4% at the cap
    assert 0.45 < sum(x < 30 for x in n) / len(n) < 0.55
    assert 0.007 < sum(x == 768 for x in n) / len(n) < 0.025
