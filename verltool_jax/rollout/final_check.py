"""The environment's final check of a trajectory, run after the model's last turn and
before the trajectory's tool state (its workspace) is released.

A row whose ``extra_info`` sets ``hidden_test_cmd`` (the SWE tasks,
:mod:`verltool_jax.tasks.swe`) gets that command run by the ``run_tests`` tool in the
trajectory's own workspace; the run's metrics (passed, failed, errors, exit_code,
timed_out, plus ``seconds``) are stored in the trajectory's
``data["extra_info"]["hidden_test_result"]``, where the ``swe`` reward reads them. The
command never appears in the model's context.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

HIDDEN_TEST_KEY = "hidden_test_cmd"
RESULT_KEY = "hidden_test_result"
RUN_TESTS_ACTION = (
    "<tool_call>" + json.dumps({"name": "run_tests", "arguments": {}}) + "</tool_call>"
)


def has_final_check(extra_field: Any) -> bool:
    """True if the trajectory's ``extra_field`` names a hidden test command."""
    return (
        isinstance(extra_field, dict)
        and isinstance(extra_field.get(HIDDEN_TEST_KEY), str)
        and bool(extra_field[HIDDEN_TEST_KEY].strip())
    )


async def run_hidden_tests(client, trajectory_id: str, extra_field: dict) -> dict:
    """Run ``extra_field["hidden_test_cmd"]`` with ``run_tests`` in the trajectory's
    workspace -> its metrics plus ``seconds`` (the call's latency) and ``valid``; an
    invalid call (no sandbox, bad repo) has ``exit_code=None`` and ``error``."""
    if not has_final_check(extra_field):
        raise ValueError(
            f'extra_field["{HIDDEN_TEST_KEY}"] is missing: the row has no '
            "hidden tests (not an SWE task)"
        )
    res = await client.get_observation(
        trajectory_id, RUN_TESTS_ACTION, dict(extra_field, test_cmd=extra_field[HIDDEN_TEST_KEY])
    )
    metrics = dict(res.extra.get("metrics") or {})
    metrics.update(seconds=res.latency_s, valid=res.valid)
    if not res.valid or "exit_code" not in metrics:
        metrics.setdefault("exit_code", None)
        metrics["error"] = res.extra.get("invalid_reason") or res.observation[:300]
    return metrics


def with_result(data: dict, result: dict) -> dict:
    """A copy of the trajectory's data row with ``extra_info[RESULT_KEY] = result`` (the
    row itself is shared by the group's trajectories and stays unchanged)."""
    extra = dict(data.get("extra_info") or {})
    extra[RESULT_KEY] = result
    return dict(data, extra_info=extra)


async def final_check(builder, tool_client) -> bool:
    """Run the hidden tests of ``builder``'s trajectory (a
    :class:`~verltool_jax.rollout.turns.TrajectoryBuilder`) if its row has any and it did
    not end in an error; the result goes into its data (:func:`with_result`), a failed
    call is recorded as ``{"exit_code": None, "error": ...}`` (the reward scores it 0).
    True if the tool server was called (the caller must then finish the trajectory)."""
    extra = builder.extra_field
    if builder.traj.termination == "error" or not has_final_check(extra):
        return False
    try:
        result = await run_hidden_tests(tool_client, builder.traj.trajectory_id, extra)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        result = {"exit_code": None, "error": f"{type(e).__name__}: {e}"}
    builder.traj.data = with_result(builder.traj.data, result)
    return True
