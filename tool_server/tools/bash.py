"""``bash``: a persistent, sandboxed shell per trajectory in its workspace.

Actions: ``<bash>cmd</bash>`` (the last one in the turn) or a fenced block
```` ```bash ... ``` ```` (also ``sh``/``shell``; the last one). The shell runs in the
trajectory's workspace (a private copy of ``extra_field["repo_path"]``, shared with
``file_editor`` and ``run_tests``, see :mod:`tool_server.kit.workspace`), inside bubblewrap: no
network, only the workspace writable, resource limits; it refuses to run when the sandbox
is unavailable (fail closed). State (``cd``, variables, functions) persists between
commands of the trajectory. A command running past the timeout gets the shell killed and
restarted (the observation says so). Output (stdout and stderr interleaved) is truncated
to ``max_obs_chars``, keeping head and tail. The shell and the workspace are removed when
the trajectory finishes or its state expires.

Options (``--tool-opt``): ``bash_timeout_s`` (per command; default and at most 0.9 x the
server's ``--timeout``, so the shell is killed and the observation says so before the server
gives up on the call),
``bash_output_cap`` (bytes kept in memory per command, 1 MiB) and the limits of
:func:`tool_server.kit.shell.workspace_limits` (prefix ``bash``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from tool_server.kit.base import Observation
from tool_server.kit.options import tool_option
from tool_server.kit.shell import (
    SandboxUnavailable,
    ShellSession,
    command_timeout,
    format_result,
    workspace_argv,
    workspace_limits,
)
from tool_server.kit.tags import fenced_blocks, last_tag_body
from tool_server.kit.workspace import WorkspaceError, WorkspaceTool


def parse_bash_action(action: str) -> str | None:
    """The command of the last ``<bash>...</bash>`` of ``action``, else of its last fenced
    ``bash``/``sh``/``shell`` block; ``None`` if there is neither."""
    body = last_tag_body(action or "", "bash")
    if body is not None:
        return body
    blocks = fenced_blocks(action or "", ("bash", "sh", "shell"))
    return blocks[-1].strip() if blocks else None


class BashTool(WorkspaceTool):
    """A persistent bash per trajectory in its sandboxed workspace."""

    name = "bash"
    call_tag = "bash"
    call_arg = "command"
    usage = "<bash>command</bash> or a ```bash fenced block; runs in the repository workspace."

    def parse_action(self, action: str) -> tuple[Any, bool]:
        cmd = parse_bash_action(action)
        return (cmd, True) if cmd is not None else (None, False)

    def timeout_s(self) -> float:
        return command_timeout(self.settings.extra, "bash_timeout_s", self.settings.timeout_s)

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        command = parsed
        if not command.strip():
            msg = "Empty bash command: write the command between <bash> and </bash>."
            return {"obs": msg, "invalid_reason": msg}, False, False
        env = self.load_env(trajectory_id)
        lock = env.setdefault("lock", asyncio.Lock())
        async with lock:
            try:
                ws = await self.workspace_async(trajectory_id, extra_field)
                timeout = self.timeout_s()
                shell: ShellSession | None = env.get("shell")
                if shell is None:
                    argv, cwd = workspace_argv(
                        ws,
                        workspace_limits(self.settings.extra, "bash", timeout),
                        self.settings.unsafe_no_sandbox,
                        ["bash", "--noprofile", "--norc"],
                    )
                    cap = tool_option(
                        self.settings.extra, "bash_output_cap", int, 1 << 20, minimum=1024
                    )
                    shell = env["shell"] = ShellSession(argv, cwd, cap)
            except (SandboxUnavailable, WorkspaceError, ValueError) as e:
                return {"obs": str(e), "invalid_reason": str(e)}, False, False
            res = await shell.run(command, timeout)
        obs = format_result(res, timeout, self.settings.max_obs_chars)
        metrics = {"exit_code": res.exit_code, "timed_out": res.timed_out}
        return {"obs": obs, "metrics": metrics}, False, True

    def on_delete(self, trajectory_id: str, env: dict) -> None:
        shell = env.get("shell")
        if shell is not None:
            shell.kill()
        super().on_delete(trajectory_id, env)
