"""Running SWE tasks through the tool server: the hidden-test check, scripted policies
(the "oracle" that applies the known fix through ``file_editor``, and the "no-op" that
only runs the visible tests) and one episode's record.

Every action goes through the real tool server (``bash`` / ``file_editor`` /
``run_tests`` sharing the trajectory's sandboxed workspace), exactly as a model's actions
would; the hidden tests (:func:`verltool_jax.rollout.final_check.run_hidden_tests`) run
before the trajectory is finished (finishing releases the workspace), as the agent loop
does for model-driven trajectories.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from verltool_jax.reporting.eval_metrics import hidden_test_result, swe_task_costs
from verltool_jax.rewards.swe_reward import swe_reward
from verltool_jax.rollout.final_check import run_hidden_tests, with_result
from verltool_jax.tasks.swe.task import make_row
from verltool_jax.tasks.swe.testing import SweTask


def tool_call(name: str, **arguments) -> str:
    """A ``<tool_call>`` action text."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


RUN_TESTS = tool_call("run_tests")


def oracle_actions(task: SweTask) -> list[str]:
    """View each file the fix changes, replace its content with the fixed one, run the
    tests, answer."""
    if not task.oracle_path:
        raise ValueError(f"task {task.task_id} has no oracle fix")
    actions = []
    root = Path(task.oracle_path)
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(root).as_posix()
        old = (Path(task.repo_path) / rel).read_text()
        actions.append(tool_call("file_editor", command="view", path=rel))
        actions.append(
            tool_call(
                "file_editor", command="str_replace", path=rel, old_str=old, new_str=p.read_text()
            )
        )
    return actions + [RUN_TESTS, "<answer>done</answer>"]


def noop_actions(task: SweTask) -> list[str]:
    """Run the visible tests and answer without editing anything."""
    return [RUN_TESTS, "<answer>done</answer>"]


POLICIES: dict[str, Callable[[SweTask], list[str]]] = {
    "oracle": oracle_actions,
    "noop": noop_actions,
}


@dataclass
class Episode:
    """One scripted trajectory, with the attributes of a model's
    :class:`~verltool_jax.rollout.trajectory.Trajectory` that the eval metrics read
    (:mod:`verltool_jax.reporting.eval_metrics`): the row with the hidden test result in
    ``data["extra_info"]``, per-call ``tool_latencies`` and ``wall_time_s``."""

    task_id: str
    data: dict
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    termination: str = ""
    observations: list = field(default_factory=list)
    tool_latencies: list = field(default_factory=list)
    reward: float | None = None
    wall_time_s: float = 0.0

    @property
    def hidden(self) -> dict:
        return hidden_test_result(self)

    @property
    def wall_s(self) -> float:
        return self.wall_time_s

    @property
    def sandbox_s(self) -> float:
        """Time inside tool calls (workspace, sandbox, tests), the hidden run included."""
        return swe_task_costs(self)["sandbox_s"]


async def run_episode(client, task: SweTask, actions: list[str], trajectory_id: str) -> Episode:
    """Send ``actions`` (turn texts) for ``task``; a turn without a tool call ends the
    episode ("eos"); then run the hidden tests, score, and finish the trajectory."""
    row = make_row(task)
    extra = row["extra_info"]
    ep = Episode(task.task_id, row)
    t0 = time.perf_counter()
    try:
        for action in actions:
            if "<tool_call>" not in action and "<bash>" not in action:
                ep.termination = "eos"
                break
            res = await client.get_observation(trajectory_id, action, extra)
            ep.tool_calls += 1
            ep.invalid_tool_calls += 0 if res.valid else 1
            ep.tool_latencies.append(res.latency_s)
            ep.observations.append(res.observation)
            if res.done:
                ep.termination = "done"
                break
        else:
            ep.termination = "max_turns"
        ep.data = with_result(row, await run_hidden_tests(client, trajectory_id, extra))
    finally:
        await client.finish(trajectory_id)
    ep.reward = swe_reward("", row["reward_model"]["ground_truth"], ep.data["extra_info"]).score
    ep.wall_time_s = time.perf_counter() - t0
    return ep


def unique_id(task: SweTask, policy: str) -> str:
    return f"{policy}-{task.task_id}-{os.getpid()}-{time.monotonic_ns()}"
