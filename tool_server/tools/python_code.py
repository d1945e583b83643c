"""``python_code``: run the model's Python in the bubblewrap sandbox.

Actions: every ``<python>...</python>`` block of the turn, in order; if there is none,
every fenced ```` ```python ```` (or ```` ```py ````) block. The blocks are joined and run
as one program. The observation is stdout, then stderr (tracebacks name the code
``main.py``; host paths are removed).

Stateless by default: each call runs in a forked child of a pre-started sandboxed
worker (see ``tool_server/python_worker.py``), with a fresh work dir and limits.
Stateful mode (``--tool-opt python_stateful=true``, or ``extra_field["stateful"]``)
keeps a per-trajectory sandboxed interpreter whose variables survive across turns;
it is killed when the trajectory is freed (or after a timeout, losing its state).

Standard input: ``extra_field["stdin"]`` (a string) is the program's stdin (else empty).
Under ``--compat verltool`` (or ``--tool-opt python_code_compat=verltool``) parsing,
program, stdin and observation follow VerlTool's python tool
(``tool_server/kit/python_compat.py``).

Options (``--tool-opt``): ``python_timeout`` (wall s, default: server timeout - 0.5),
``python_cpu_s``, ``python_memory_mb`` (1024: address space of each process, and the
memory budget of all processes of a call together, measured every 20 ms, see
``python_worker.call_memory_bytes``), ``python_nproc`` (64), ``python_nofile`` (256),
``python_fsize_mb`` (64), ``python_disk_mb`` (256: size of each of the sandbox's two
tmpfs, ``/tmp`` and ``/workspace``; no host directory is writable), ``python_stateful``
(false), ``python_max_kernels`` (32: live stateful interpreters; the least recently used
trajectory's is freed first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import sys
from typing import Any

from tool_server.kit import python_compat as vt
from tool_server.kit.base import BaseTool, Observation
from tool_server.kit.options import tool_option
from tool_server.kit.tags import fenced_blocks, tag_bodies
from tool_server.python_pool import PythonPool, RunResult, SandboxProcess, WorkerDied
from tool_server.sandbox import DEFAULT_TMP_MB, ResourceLimits, SandboxUnavailable, sandbox_status

_RUN_DIR_RE = re.compile(r"/workspace/run_[A-Za-z0-9_]+/")


def extract_code(action: str) -> str | None:
    """All ``<python>`` blocks joined by newlines, else all fenced python blocks, else None."""
    blocks = tag_bodies(action, "python")
    if not blocks:
        blocks = fenced_blocks(action, ("python", "py"))
    if not blocks:
        return None
    return "\n".join(b.strip("\n") for b in blocks)


def _path_prefixes() -> list[str]:
    out = set()
    for p in (
        sys.base_prefix,
        sys.prefix,
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sys.prefix),
    ):
        out.add(p.rstrip("/") + "/")
    return sorted(out, key=len, reverse=True)


def clean_paths(text: str, prefixes: list[str] | None = None) -> str:
    """Remove host/sandbox path prefixes from tracebacks: the per-call run dir and the
    Python installation (``/root/.pyenv/.../lib/python3.11/x.py`` -> ``lib/python3.11/x.py``)."""
    text = _RUN_DIR_RE.sub("", text)
    for p in prefixes if prefixes is not None else _path_prefixes():
        text = text.replace(p, "")
    return text


def format_result(r: RunResult, limits: ResourceLimits) -> str:
    """The observation text for a run: stdout, then stderr, then what stopped it."""
    parts = [r.stdout]
    if r.stderr:
        if parts[0] and not parts[0].endswith("\n"):
            parts.append("\n")
        parts.append(clean_paths(r.stderr))
    text = "".join(parts)
    notes = []
    if r.timed_out:
        notes.append(
            f"TimeoutError: the code ran longer than the {limits.wall_s:g} s "
            "time limit and was stopped."
        )
    elif r.memory_exceeded:
        notes.append(
            f"MemoryError: the program's processes used more than "
            f"{limits.total_memory_mb or limits.memory_mb} MB together and were "
            "stopped."
        )
    elif r.truncated:
        notes.append(
            "[output truncated"
            + ("; the program printed too much and was stopped]" if r.signal is not None else "]")
        )
    elif r.signal is not None:
        if r.signal in (signal.SIGXCPU, signal.SIGKILL):
            notes.append(
                f"Killed (signal {signal.Signals(r.signal).name}): CPU time limit "
                f"of {limits.cpu_s} s or another resource limit was exceeded."
            )
        else:
            try:
                name = signal.Signals(r.signal).name
            except ValueError:
                name = str(r.signal)
            notes.append(f"Killed by signal {name}.")
    if notes:
        if text and not text.endswith("\n"):
            text += "\n"
        text += "\n".join(notes)
    return text


class PythonCodeTool(BaseTool):
    name = "python_code"
    call_tag = "python"
    call_arg = "code"
    usage = (
        "Run Python code in a sandbox: write it inside <python>...</python> (or a "
        "```python fenced block). Print what you want to see; stdout and stderr are "
        "returned. No network; files live only for this call."
    )
    verltool_usage = (
        "You are able to write and execute Python code securely inside a Firejail sandbox."
    )

    def __init__(self, settings=None) -> None:
        super().__init__(settings)
        extra = self.settings.extra
        timeout = self.settings.timeout_s
        wall = tool_option(extra, "python_timeout", float, max(0.5, timeout - 0.5), minimum=0.1)
        self.limits = ResourceLimits(
            cpu_s=tool_option(extra, "python_cpu_s", int, max(1, int(wall + 0.999)), minimum=1),
            memory_mb=tool_option(extra, "python_memory_mb", int, 1024, minimum=64),
            nproc=tool_option(extra, "python_nproc", int, 64, minimum=4),
            nofile=tool_option(extra, "python_nofile", int, 256, minimum=16),
            fsize_mb=tool_option(extra, "python_fsize_mb", int, 64, minimum=1),
            wall_s=wall,
        )
        self.limits = dataclasses.replace(self.limits, total_memory_mb=self.limits.memory_mb)
        self.disk_mb = tool_option(extra, "python_disk_mb", int, DEFAULT_TMP_MB, minimum=1)
        self.stateful = tool_option(extra, "python_stateful", bool, False)
        self.max_kernels = tool_option(extra, "python_max_kernels", int, 32, minimum=1)
        self.max_output = max(4 * self.settings.max_obs_chars, 4096)
        if self.verltool_compat:  # bytes enough for VerlTool's 100000-character cut
            self.max_output = max(self.max_output, 4 * vt.MAX_OBS_CHARS + 4096)
        self.unsafe = bool(self.settings.unsafe_no_sandbox)
        self.root_dir = os.path.join(self.settings.workdir, f"python_{os.getpid()}")
        self.pool = PythonPool(
            self.settings.workers, self.root_dir, unsafe=self.unsafe, tmp_mb=self.disk_mb
        )
        self._refusal: str | None = None

    async def astart(self) -> None:
        if not self.unsafe:
            ok, why = await asyncio.to_thread(sandbox_status)
            if not ok:
                self._refusal = why
                return
        await self.pool.start()

    async def aclose(self) -> None:
        self.close()
        await self.pool.close()

    def keeps_state(self, extra_field: dict) -> bool:
        return bool((extra_field or {}).get("stateful", self.stateful))  # the interpreter

    def parse_action(self, action: str) -> tuple[Any, bool]:
        if self.verltool_compat:
            code = vt.extract_code(action)
            return (vt.CompatCall(code, action), True) if code is not None else (None, False)
        code = extract_code(action)
        return (code, True) if code is not None else (None, False)

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        if self._refusal is not None:
            return (
                {
                    "obs": f"Refusing to run code: the sandbox is unavailable ({self._refusal}).",
                    "invalid_reason": "sandbox_unavailable",
                },
                False,
                False,
            )
        if isinstance(parsed, vt.CompatCall):
            return await self._conduct_verltool(trajectory_id, parsed, extra_field), False, True
        code = parsed
        if not code.strip():
            return "Error: the python block is empty.", False, True
        stdin = (extra_field or {}).get("stdin")
        result = await self._run(
            trajectory_id, code, extra_field, stdin if isinstance(stdin, str) else None
        )
        if result.error is not None:
            return {"obs": f"Error: {result.error}.", "metrics": {"sandbox_error": 1}}, False, True
        return format_result(result, self.limits), False, True

    async def _run(
        self, trajectory_id: str, code: str, extra_field: dict, stdin: str | None
    ) -> RunResult:
        if bool((extra_field or {}).get("stateful", self.stateful)):
            return await self._run_stateful(trajectory_id, code, stdin)
        return await self.pool.run(code, self.limits, self.max_output, stdin)

    async def _conduct_verltool(
        self, trajectory_id: str, call: vt.CompatCall, extra_field: dict
    ) -> Observation:
        """VerlTool's observation for ``call`` (``_python_compat`` docstring)."""
        if vt.is_blocked(call.code):
            result = vt.blocked_result()
        else:
            result = await self._run(
                trajectory_id,
                vt.program(call.code),
                extra_field,
                vt.stdin_for(call.action, extra_field),
            )
        if result.error is not None:
            return {"obs": f"Error: {result.error}.", "metrics": {"sandbox_error": 1}}
        text = vt.result_text(result, self.limits.wall_s, clean_paths)
        return vt.wrap_observation(call.action, text)

    async def _run_stateful(
        self, trajectory_id: str, code: str, stdin: str | None = None
    ) -> RunResult:
        env = self.load_env(trajectory_id)
        kernel: SandboxProcess | None = env.get("kernel")
        note = ""
        if kernel is None or not kernel.alive:
            if kernel is not None:
                note = "(The previous interpreter was stopped; its variables are lost.)\n"
            self._evict_kernels(keep=trajectory_id)
            kernel = SandboxProcess(
                "kernel", self.root_dir, unsafe=self.unsafe, tmp_mb=self.disk_mb
            )
            env["kernel"] = kernel
            self.save_env(trajectory_id, env)
            try:
                await kernel.start()
            except SandboxUnavailable as e:
                return RunResult(error=str(e))
        try:
            r = await kernel.call(code, self.limits, self.max_output, stdin)
        except WorkerDied as e:
            kernel.kill()
            timed_out = "no answer" in str(e)
            return RunResult(
                stdout=note,
                timed_out=timed_out,
                error=None
                if timed_out
                else f"the sandboxed interpreter was killed ({e}); its variables are lost",
            )
        if r.kernel_lost:
            r.stdout += (
                "\n" if r.stdout and not r.stdout.endswith("\n") else ""
            ) + "(The interpreter was stopped; its variables are lost.)\n"
        if note:
            r.stdout = note + r.stdout
        return r

    def _evict_kernels(self, keep: str) -> None:
        """Keep at most ``max_kernels - 1`` other live interpreters: free the least
        recently used trajectories' state (each interpreter is a process)."""
        live = [t for t, e in self.env.items() if t != keep and e.get("kernel") is not None]
        live.sort(key=lambda t: self._last_used.get(t, 0.0))
        while len(live) >= self.max_kernels:
            self.delete_env(live.pop(0))

    def on_delete(self, trajectory_id: str, env: dict) -> None:
        kernel = env.get("kernel")
        if kernel is not None:
            kernel.kill()
