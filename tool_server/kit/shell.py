"""Sandboxed shell processes for the workspace tools (not a tool: ``_`` files are skipped).

Shared by ``bash`` (a persistent shell per trajectory) and ``run_tests`` (one sandboxed
command per call):

* :func:`workspace_argv` - the bubblewrap argv that runs a command in a trajectory's
  workspace (:mod:`tool_server.kit.workspace`) with no network, only the workspace writable,
  and resource limits; it fails closed (:class:`SandboxUnavailable`) unless the server was
  started with ``unsafe_no_sandbox``.
* :class:`OutputBuffer` - collects a command's output in bounded memory (head and tail
  kept, the middle dropped and counted).
* :class:`ShellSession` - one long-lived ``bash`` talking over pipes. Each command is sent
  base64-encoded and run with ``eval`` (so a syntax error cannot leave the shell waiting for
  more input, and ``cd``/``export`` persist), with stdin from ``/dev/null``, followed by a
  random per-command end marker that carries the exit status. A command that outlives its
  timeout gets the whole sandbox killed (process group + pid namespace).
* :func:`run_once` - one command in a fresh sandbox, with a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import signal
import sys
import uuid
import weakref
from dataclasses import dataclass

from tool_server.kit.observations import truncate_text
from tool_server.kit.options import tool_option
from tool_server.kit.workspace import Workspace
from tool_server.python_pool import WORKER_FILE, WORKER_SANDBOX_PATH
from tool_server.sandbox import (
    ProcessHandle,
    ResourceLimits,
    SandboxUnavailable,
    bwrap_argv,
    bwrap_path,
    packed_argv,
    require_sandbox,
)

log = logging.getLogger("tool_server.shell")

__all__ = [
    "command_timeout",
    "workspace_argv",
    "workspace_limits",
    "OutputBuffer",
    "ShellResult",
    "ShellSession",
    "run_once",
    "format_result",
    "SandboxUnavailable",
]


def command_timeout(
    extra: dict | None, key: str, server_timeout_s: float, requested: float | None = None
) -> float:
    """Wall-clock limit of one command: the ``key`` option (or ``requested``), capped at
    ``0.9 * server_timeout_s`` so the tool's own timeout (which kills and reports) fires
    before the server cuts the call off. Default: that cap."""
    cap = 0.9 * server_timeout_s
    value = requested if requested is not None else tool_option(extra, key, float, cap, minimum=0.1)
    return min(float(value), cap)


def workspace_limits(extra: dict | None, prefix: str, wall_s: float) -> ResourceLimits:
    """Resource limits for a workspace sandbox from the ``<prefix>_*`` tool options.

    Options (``--tool-opt``): ``<prefix>_cpu_s`` (CPU seconds per process, default 120),
    ``<prefix>_memory_mb`` (address space per process, 4096), ``<prefix>_nproc`` (256),
    ``<prefix>_nofile`` (1024), ``<prefix>_fsize_mb`` (largest file written, 512),
    ``<prefix>_total_memory_mb`` (memory of all the sandbox's processes together, measured
    every 50 ms by a watcher in the sandbox; default ``<prefix>_memory_mb``).
    """
    memory_mb = tool_option(extra, f"{prefix}_memory_mb", int, 4096, minimum=64)
    return ResourceLimits(
        cpu_s=tool_option(extra, f"{prefix}_cpu_s", int, 120, minimum=1),
        memory_mb=memory_mb,
        total_memory_mb=tool_option(extra, f"{prefix}_total_memory_mb", int, memory_mb, minimum=64),
        nproc=tool_option(extra, f"{prefix}_nproc", int, 256, minimum=4),
        nofile=tool_option(extra, f"{prefix}_nofile", int, 1024, minimum=16),
        fsize_mb=tool_option(extra, f"{prefix}_fsize_mb", int, 512, minimum=1),
        wall_s=wall_s,
    )


def workspace_argv(
    ws: Workspace, limits: ResourceLimits, unsafe_no_sandbox: bool, command: list[str]
) -> tuple[list[str], str | None]:
    """``(argv, cwd)`` that runs ``command`` in ``ws``.

    Sandboxed (the default): bubblewrap with the workspace at ``ws.sandbox_path`` as the
    only writable host path, no network, ``limits`` applied by ``prlimit``, run as
    ``ws.uid`` when the server is root; ``cwd`` is ``None`` (bwrap changes directory).
    Raises :class:`SandboxUnavailable` when bubblewrap does not work here.
    With ``unsafe_no_sandbox``: the bare command in ``ws.root`` (logged loudly).
    """
    if unsafe_no_sandbox:
        log.warning("UNSAFE: running %r without a sandbox in %s", command[:1], ws.root)
        return list(command), ws.root
    require_sandbox()
    ro_binds = []
    if limits.total_memory_mb:  # all processes of the sandbox under one measured budget
        ro_binds.append((WORKER_FILE, WORKER_SANDBOX_PATH))
        command = [
            os.path.basename(sys.executable),
            "-I",
            WORKER_SANDBOX_PATH,
            "watch",
            str(limits.total_memory_mb),
            "--",
            *command,
        ]
    return bwrap_argv(
        ws.root,
        limits=limits,
        uid=ws.uid,
        workdir_dest=ws.sandbox_path,
        ro_binds=ro_binds,
        env={"TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", "PYTHONUNBUFFERED": "1"},
    ) + list(command), None


class OutputBuffer:
    """Bytes of a command's output, at most about ``2 * cap`` kept in memory.

    When the buffer grows past ``2 * cap`` the middle is dropped: the first ``cap`` and the
    last ``cap`` bytes are kept and ``dropped`` counts the rest.
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(1024, cap)
        self.buf = bytearray()
        self.dropped = 0
        self._cut_at = -1  # position in buf where bytes were dropped

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > 2 * self.cap:
            excess = len(self.buf) - 2 * self.cap
            del self.buf[self.cap : self.cap + excess]
            self.dropped += excess
            self._cut_at = self.cap

    def text(self, end: int | None = None) -> str:
        """The kept output (up to byte ``end``) decoded, with a note where bytes were dropped."""
        data = bytes(self.buf[:end] if end is not None else self.buf)
        if self.dropped and 0 <= self._cut_at <= len(data):
            return (
                data[: self._cut_at].decode("utf-8", "replace")
                + f"\n[... {self.dropped} bytes of output dropped ...]\n"
                + data[self._cut_at :].decode("utf-8", "replace")
            )
        return data.decode("utf-8", "replace")


@dataclass
class ShellResult:
    """What one command produced: its output, its exit status (``None`` if unknown), and
    whether it timed out or the shell itself exited (both mean the shell is gone)."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    shell_exited: bool = False


# The pidfd handle of each process :func:`_spawn` started (dropped with the process).
_HANDLES: weakref.WeakKeyDictionary[asyncio.subprocess.Process, ProcessHandle] = (
    weakref.WeakKeyDictionary()
)


async def _spawn(argv: list[str], **kwargs) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec``; a bubblewrap argv has its options passed through
    a memory file (:func:`packed_argv`: no host path in the sandbox's ``/proc/1/cmdline``),
    and the process gets a :class:`ProcessHandle` (a pidfd taken right after the spawn)."""
    fd = None
    if argv and argv[0] == bwrap_path() and "--" in argv:
        argv, fd = packed_argv(argv)
        kwargs["pass_fds"] = (fd,)
    try:
        proc = await asyncio.create_subprocess_exec(*argv, **kwargs)
    finally:
        if fd is not None:
            os.close(fd)
    _HANDLES[proc] = ProcessHandle(proc.pid)
    return proc


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL ``proc`` through its pidfd, so a pid recycled after the process was reaped
    is never hit. In the sandbox everything else dies with it (bwrap --die-with-parent and
    the pid namespace); without one (``unsafe_no_sandbox``) its process group is killed
    too while the process is still running."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _HANDLES[proc].kill()


class ShellSession:
    """A persistent ``bash`` in a sandbox: :meth:`run` one command at a time."""

    def __init__(self, argv: list[str], cwd: str | None, output_cap: int) -> None:
        self.argv = argv
        self.cwd = cwd
        self.output_cap = output_cap
        self.proc: asyncio.subprocess.Process | None = None
        self.commands_run = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        self.proc = await _spawn(
            self.argv,
            cwd=self.cwd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )

    async def run(self, command: str, timeout_s: float) -> ShellResult:
        """Run ``command`` in the shell; stdout and stderr are interleaved as written."""
        if not self.alive:
            await self.start()
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        marker = f"__VTJ_END_{uuid.uuid4().hex}__"
        end_re = re.compile(rb"\n" + marker.encode() + rb"(-?\d+)__\n")
        b64 = base64.b64encode(command.encode("utf-8")).decode("ascii")
        script = (
            f"eval \"$(printf %s '{b64}' | base64 -d)\" < /dev/null\n"
            f"printf '\\n{marker}%s__\\n' \"$?\"\n"
        )
        out = OutputBuffer(self.output_cap)
        self.commands_run += 1
        try:
            self.proc.stdin.write(script.encode())
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return await self._exited(out)

        stdout = self.proc.stdout

        async def read_until_marker() -> re.Match | None:
            while True:
                chunk = await stdout.read(65536)
                if not chunk:
                    return None
                out.add(chunk)
                # the marker can only end in the newest chunk
                m = end_re.search(out.buf, max(0, len(out.buf) - len(chunk) - len(marker) - 40))
                if m:
                    return m

        try:
            m = await asyncio.wait_for(read_until_marker(), timeout_s)
        except TimeoutError:
            self.kill()
            return ShellResult(out.text(), None, timed_out=True)
        except asyncio.CancelledError:  # the server gave up on the call: do not leave it running
            self.kill()
            raise
        if m is None:
            return await self._exited(out)
        return ShellResult(out.text(m.start()), int(m.group(1)))

    async def _exited(self, out: OutputBuffer) -> ShellResult:
        code = None
        if self.proc is not None:
            try:
                code = await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                pass
            self.kill()
        return ShellResult(out.text(), code, shell_exited=True)

    def kill(self) -> None:
        """Kill the shell and everything it started (idempotent); the next :meth:`run`
        starts a new shell."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        _kill_group(proc)
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except (OSError, RuntimeError):
                pass
        try:  # reap it in the background when an event loop is running
            asyncio.get_running_loop().create_task(proc.wait())
        except RuntimeError:
            pass


async def run_once(
    argv: list[str], cwd: str | None, timeout_s: float, output_cap: int
) -> ShellResult:
    """Run ``argv`` (stdin ``/dev/null``) to completion or ``timeout_s``, killing the whole
    process group on timeout."""
    proc = await _spawn(
        argv,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    out = OutputBuffer(output_cap)
    stdout = proc.stdout
    assert stdout is not None  # stdout=PIPE above

    async def pump() -> None:
        while True:
            chunk = await stdout.read(65536)
            if not chunk:
                return
            out.add(chunk)

    try:
        await asyncio.wait_for(pump(), timeout_s)
        code = await asyncio.wait_for(proc.wait(), max(1.0, timeout_s))
    except TimeoutError:
        _kill_group(proc)
        await proc.wait()
        return ShellResult(out.text(), None, timed_out=True)
    except asyncio.CancelledError:
        _kill_group(proc)
        raise
    return ShellResult(out.text(), code)


def format_result(res: ShellResult, timeout_s: float, max_chars: int) -> str:
    """The observation text for a shell command: its (truncated) output, then a status line
    when the command failed, timed out or ended the shell."""
    text = res.output[:-1] if res.output.endswith("\n") else res.output
    notes = []
    if res.timed_out:
        notes.append(
            f"[command timed out after {timeout_s:g}s; the shell was killed and will "
            "be restarted for the next command: working directory, variables and "
            "background jobs are reset]"
        )
    elif res.shell_exited:
        notes.append(
            f"[the shell exited (status {res.exit_code}); a new shell will be started "
            "for the next command]"
        )
    elif res.exit_code:
        notes.append(f"[exit code {res.exit_code}]")
    tail = "\n".join(notes)
    budget = max(256, max_chars - len(tail) - 1)
    text = truncate_text(text, budget) if text else ""
    return (text + ("\n" if text and tail else "") + tail) if (text or tail) else "[no output]"
