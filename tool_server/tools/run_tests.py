"""``run_tests``: run the task's tests in the trajectory's workspace and count the results.

Action: ``<tool_call>{"name": "run_tests", "arguments": {}}</tool_call>``. Runs
``extra_field["test_cmd"]`` (default ``python -m pytest -q``) with ``bash -c`` in a fresh
sandbox over the trajectory's workspace (the same files ``bash`` and ``file_editor``
changed; see :mod:`tool_server.kit.workspace`), with a timeout of
``extra_field["test_timeout_s"]`` or the ``run_tests_timeout_s`` option, at most (and by
default) 0.9 x the server's ``--timeout`` (start the server with a ``--timeout`` long enough
for the test suite, and a shorter ``bash_timeout_s`` for shell commands).
The observation shows the (truncated) output and carries
``metrics = {passed, failed, errors, skipped, exit_code, timed_out}`` parsed from the pytest
summary line, and ``reward`` = 1.0 when the command exited 0 with at least one test passed
and none failed or errored, else 0.0 (what the SWE reward uses).
"""

from __future__ import annotations

import re
from typing import Any

from tool_server.kit.base import Observation
from tool_server.kit.shell import (
    SandboxUnavailable,
    command_timeout,
    format_result,
    run_once,
    workspace_argv,
    workspace_limits,
)
from tool_server.kit.tool_calls import ToolCallError, parse_tool_call_for, register_names
from tool_server.kit.workspace import WorkspaceError, WorkspaceTool

RUN_TESTS_NAMES = register_names({"run_tests"})
DEFAULT_TEST_CMD = "python -m pytest -q"
_COUNT_RE = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")


def parse_test_counts(output: str) -> dict[str, int]:
    """Counts from a pytest summary such as ``2 failed, 5 passed, 1 error in 0.1s``.

    Uses the last line of ``output`` that contains a count; ``error``/``errors`` are summed
    under ``errors``. Keys: passed, failed, errors, skipped, xfailed, xpassed (0 if absent).
    """
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "xfailed": 0, "xpassed": 0}
    for line in reversed(output.splitlines()):
        found = _COUNT_RE.findall(line)
        if found:
            for n, kind in found:
                counts["errors" if kind.startswith("error") else kind] += int(n)
            break
    return counts


def reward_from_counts(counts: dict[str, int], exit_code: Any) -> float:
    """1.0 if the test command exited 0, at least one test passed and none failed or
    errored; else 0.0."""
    ok = exit_code == 0 and counts["passed"] > 0 and counts["failed"] == counts["errors"] == 0
    return 1.0 if ok else 0.0


class RunTestsTool(WorkspaceTool):
    """Runs ``extra_field["test_cmd"]`` in the trajectory's sandboxed workspace."""

    name = "run_tests"
    usage = '<tool_call>{"name": "run_tests", "arguments": {}}</tool_call>'

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return parse_tool_call_for(action, RUN_TESTS_NAMES)

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        if isinstance(parsed, ToolCallError):
            return {"obs": parsed.message, "invalid_reason": parsed.message}, False, False
        if parsed.arguments:
            msg = (
                "run_tests takes no arguments (it runs the task's test command); got "
                f"{sorted(parsed.arguments)}."
            )
            return {"obs": msg, "invalid_reason": msg}, False, False
        extra_field = extra_field or {}
        try:
            cmd = extra_field.get("test_cmd", DEFAULT_TEST_CMD)
            if not isinstance(cmd, str) or not cmd.strip():
                raise ValueError(
                    'extra_field["test_cmd"] must be a non-empty shell command '
                    f"string, got {cmd!r:.80}"
                )
            requested = extra_field.get("test_timeout_s")
            if requested is not None and (
                isinstance(requested, bool)
                or not isinstance(requested, (int, float))
                or requested <= 0
            ):
                raise ValueError(
                    'extra_field["test_timeout_s"] must be a positive number, got '
                    f"{requested!r:.40}"
                )
            timeout = command_timeout(
                self.settings.extra, "run_tests_timeout_s", self.settings.timeout_s, requested
            )
            ws = await self.workspace_async(trajectory_id, extra_field)
            argv, cwd = workspace_argv(
                ws,
                workspace_limits(self.settings.extra, "run_tests", float(timeout)),
                self.settings.unsafe_no_sandbox,
                ["bash", "-c", cmd],
            )
        except (SandboxUnavailable, WorkspaceError, ValueError) as e:
            return {"obs": str(e), "invalid_reason": str(e)}, False, False
        res = await run_once(argv, cwd, float(timeout), 1 << 20)
        counts = parse_test_counts(res.output)
        metrics = dict(counts, exit_code=res.exit_code, timed_out=res.timed_out)
        summary = (
            f"[tests: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['errors']} errors; exit code {res.exit_code}"
            f"{', timed out' if res.timed_out else ''}]"
        )
        text = format_result(res, float(timeout), self.settings.max_obs_chars - len(summary) - 1)
        return (
            {
                "obs": text + "\n" + summary,
                "metrics": metrics,
                "reward": reward_from_counts(counts, res.exit_code),
            },
            False,
            True,
        )
