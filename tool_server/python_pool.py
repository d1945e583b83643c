"""Server side of the sandboxed Python workers (see ``python_worker.py``).

:class:`SandboxProcess` is one long-lived worker process inside bubblewrap, spoken to
over its stdin/stdout; :class:`PythonPool` keeps ``size`` of them (fork servers) and
hands each call to an idle one. A worker that dies (killed by the code, or cut off by
the backstop timeout) is replaced in the background; the call gets an error result.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Optional

from tool_server.sandbox import (SANDBOX_WORKDIR, ResourceLimits, SandboxUnavailable,
                                 bwrap_argv, require_sandbox)

log = logging.getLogger("tool_server.python")

_WORKER_SOURCE: Optional[str] = None
STARTUP_TIMEOUT_S = 30.0
BACKSTOP_S = 3.0  # extra time the server grants a worker beyond the call's wall limit


def worker_source() -> str:
    global _WORKER_SOURCE
    if _WORKER_SOURCE is None:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "python_worker.py")) as f:
            _WORKER_SOURCE = f.read()
    return _WORKER_SOURCE


@dataclass
class RunResult:
    """What one call produced. ``error`` is set when no result came from the sandbox
    (it could not start, or the worker process died)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    truncated: bool = False
    elapsed_s: float = 0.0
    error: Optional[str] = None


class WorkerDied(RuntimeError):
    """The worker process ended (or was cut off) in the middle of a call."""


def _limits_dict(limits: ResourceLimits) -> dict:
    return asdict(limits)


class SandboxProcess:
    """One sandboxed worker: ``mode`` is ``"fork"`` (fork server) or ``"kernel"``
    (stateful, code runs in-process). ``unsafe=True`` runs it without bubblewrap."""

    def __init__(self, mode: str, root_dir: str, unsafe: bool = False) -> None:
        if mode not in ("fork", "kernel"):
            raise ValueError(f"mode must be 'fork' or 'kernel', got {mode!r}")
        self.mode = mode
        self.root_dir = root_dir
        self.unsafe = unsafe
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.host_dir: Optional[str] = None
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Start the process and wait for its ready message (raises ``SandboxUnavailable``)."""
        os.makedirs(self.root_dir, exist_ok=True)
        self.host_dir = tempfile.mkdtemp(dir=self.root_dir, prefix=f"py{self.mode}_")
        src = worker_source()
        if self.unsafe:
            worker_mode = "unsafe" if self.mode == "fork" else "kernel"
            argv = [sys.executable, "-I", "-c", src, worker_mode, self.host_dir]
        else:
            require_sandbox()
            worker_mode = "isolated" if self.mode == "fork" else "kernel"
            argv = bwrap_argv(self.host_dir, limits=None) + [
                sys.executable, "-I", "-c", src, worker_mode, SANDBOX_WORKDIR]
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL if self.mode == "kernel" else asyncio.subprocess.PIPE,
            limit=1 << 24)
        try:
            msg = await asyncio.wait_for(self._read(), STARTUP_TIMEOUT_S)
        except asyncio.CancelledError:
            self.kill()
            raise
        except (asyncio.TimeoutError, WorkerDied, asyncio.IncompleteReadError) as e:
            err = b""
            if self.proc.stderr is not None:
                try:
                    err = await asyncio.wait_for(self.proc.stderr.read(4000), 1.0)
                except asyncio.TimeoutError:
                    pass
            self.kill()
            raise SandboxUnavailable(f"the sandboxed python worker did not start: "
                                     f"{err.decode(errors='replace').strip() or e!r}") from None
        if not msg.get("ready"):
            self.kill()
            raise SandboxUnavailable(f"unexpected worker greeting {msg!r}")

    async def _read(self) -> dict:
        try:
            head = await self.proc.stdout.readexactly(4)
            body = await self.proc.stdout.readexactly(struct.unpack(">I", head)[0])
        except asyncio.IncompleteReadError:
            raise WorkerDied("the worker process exited") from None
        return json.loads(body)

    async def call(self, code: str, limits: ResourceLimits, max_output: int,
                   stdin: Optional[str] = None) -> RunResult:
        """Run one snippet (``stdin``: its standard input; None: empty); raises
        :class:`WorkerDied` if the process ends or overruns ``limits.wall_s + BACKSTOP_S``
        (then it is killed)."""
        async with self._lock:
            if not self.alive:
                raise WorkerDied("the worker process is not running")
            msg = {"code": code, "limits": _limits_dict(limits), "max_output": max_output}
            if stdin is not None:
                msg["stdin"] = stdin
            data = json.dumps(msg).encode()
            try:
                self.proc.stdin.write(struct.pack(">I", len(data)) + data)
                await self.proc.stdin.drain()
                backstop = BACKSTOP_S if self.mode == "fork" else 0.0
                reply = await asyncio.wait_for(self._read(), limits.wall_s + backstop)
            except asyncio.CancelledError:
                # the caller gave up mid-call: the reply would reach the next caller
                self.kill()
                raise
            except (ConnectionError, BrokenPipeError):
                self.kill()
                raise WorkerDied("the worker process exited") from None
            except asyncio.TimeoutError:
                self.kill()
                raise WorkerDied(f"no answer within {limits.wall_s:g} s") from None
            except WorkerDied:
                self.kill()
                raise
            return RunResult(**reply)

    def kill(self) -> None:
        """Stop the process (its whole sandbox goes with it) and delete its host dir."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        if self.host_dir is not None:
            shutil.rmtree(self.host_dir, ignore_errors=True)
            self.host_dir = None


class PythonPool:
    """``size`` fork-server workers; :meth:`run` uses an idle one (waiting if none)."""

    def __init__(self, size: int, root_dir: str, unsafe: bool = False) -> None:
        if size < 1:
            raise ValueError(f"pool size (--workers) must be >= 1, got {size}")
        self.size = size
        self.root_dir = root_dir
        self.unsafe = unsafe
        self._idle: Optional[asyncio.Queue] = None
        self._all: list[SandboxProcess] = []
        self.restarts = 0

    async def start(self) -> None:
        self._idle = asyncio.Queue()
        workers = [SandboxProcess("fork", self.root_dir, self.unsafe) for _ in range(self.size)]
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        for w, r in zip(workers, results):
            if isinstance(r, BaseException):
                log.error("python worker failed to start: %s", r)
            self._all.append(w)
            self._idle.put_nowait(w)

    async def run(self, code: str, limits: ResourceLimits, max_output: int = 1 << 20,
                  stdin: Optional[str] = None) -> RunResult:
        if self._idle is None:
            await self.start()
        worker: SandboxProcess = await self._idle.get()
        try:
            if not worker.alive:
                try:
                    await worker.start()
                except SandboxUnavailable as e:
                    return RunResult(error=str(e))
            try:
                return await worker.call(code, limits, max_output, stdin)
            except WorkerDied as e:
                self.restarts += 1
                return RunResult(error=f"the sandboxed process was killed ({e})")
        finally:
            if worker.alive:
                self._idle.put_nowait(worker)
            else:
                asyncio.get_running_loop().create_task(self._restart(worker))

    async def _restart(self, worker: SandboxProcess) -> None:
        worker.kill()
        try:
            await worker.start()
        except SandboxUnavailable as e:
            log.error("restarting a python worker failed: %s", e)
        self._idle.put_nowait(worker)

    async def close(self) -> None:
        for w in self._all:
            w.kill()
        self._all.clear()
