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
from dataclasses import asdict, dataclass

from tool_server.sandbox import (
    DEFAULT_TMP_MB,
    SANDBOX_WORKDIR,
    ProcessHandle,
    ResourceLimits,
    SandboxUnavailable,
    bwrap_argv,
    packed_argv,
    require_sandbox,
)

log = logging.getLogger("tool_server.python")

STARTUP_TIMEOUT_S = 30.0
BACKSTOP_S = 3.0  # extra time the server grants a worker beyond the call's wall limit
WORKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_worker.py")
WORKER_SANDBOX_PATH = "/opt/verltool/python_worker.py"  # where the sandbox sees it
MAX_HEADER = 1 << 16  # bytes of a reply's JSON header; a longer one is a protocol violation


@dataclass
class RunResult:
    """What one call produced. ``error`` is set when no result came from the sandbox
    (it could not start, or the worker process died)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    truncated: bool = False
    elapsed_s: float = 0.0
    error: str | None = None
    memory_exceeded: bool = False
    kernel_lost: bool = False


class WorkerDied(RuntimeError):
    """The worker process ended (or was cut off) in the middle of a call."""


def _limits_dict(limits: ResourceLimits) -> dict:
    return asdict(limits)


class SandboxProcess:
    """One sandboxed worker: ``mode`` is ``"fork"`` (fork server) or ``"kernel"``
    (stateful: a protocol process and one kernel process that keeps the namespace).
    ``unsafe=True`` runs it without bubblewrap. ``tmp_mb`` sizes the sandbox's ``/tmp`` and
    ``/workspace`` (two tmpfs; no host directory is writable)."""

    def __init__(
        self, mode: str, root_dir: str, unsafe: bool = False, tmp_mb: int = DEFAULT_TMP_MB
    ) -> None:
        if mode not in ("fork", "kernel"):
            raise ValueError(f"mode must be 'fork' or 'kernel', got {mode!r}")
        self.mode = mode
        self.root_dir = root_dir
        self.unsafe = unsafe
        self.tmp_mb = tmp_mb
        self.proc: asyncio.subprocess.Process | None = None
        self.handle: ProcessHandle | None = None
        self.killed = False
        self.host_dir: str | None = None
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        """Started, not killed by us and not seen to exit (``returncode`` is set only once
        the event loop has reaped the process, so a kill is recorded at once)."""
        return self.proc is not None and not self.killed and self.proc.returncode is None

    async def start(self) -> None:
        """Start the process and wait for its ready message (raises ``SandboxUnavailable``)."""
        self.killed = False
        fd = None
        if self.unsafe:
            os.makedirs(self.root_dir, exist_ok=True)
            self.host_dir = tempfile.mkdtemp(dir=self.root_dir, prefix=f"py{self.mode}_")
            worker_mode = "unsafe" if self.mode == "fork" else "kernel-unsafe"
            argv = [sys.executable, "-I", WORKER_FILE, worker_mode, self.host_dir]
        else:
            require_sandbox()
            worker_mode = "isolated" if self.mode == "fork" else "kernel"
            argv, fd = packed_argv(
                bwrap_argv(
                    None,
                    limits=None,
                    tmp_mb=self.tmp_mb,
                    ro_binds=[(WORKER_FILE, WORKER_SANDBOX_PATH)],
                )
                + [
                    os.path.basename(sys.executable),
                    "-I",
                    WORKER_SANDBOX_PATH,
                    worker_mode,
                    SANDBOX_WORKDIR,
                ]
            )
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL
                if self.mode == "kernel"
                else asyncio.subprocess.PIPE,
                pass_fds=() if fd is None else (fd,),
            )
            self.handle = ProcessHandle(self.proc.pid)
        finally:
            if fd is not None:
                os.close(fd)
        try:
            msg = await asyncio.wait_for(self._read_header(), STARTUP_TIMEOUT_S)
        except asyncio.CancelledError:
            self.kill()
            raise
        except (TimeoutError, WorkerDied, asyncio.IncompleteReadError) as e:
            err = b""
            if self.proc.stderr is not None:
                try:
                    err = await asyncio.wait_for(self.proc.stderr.read(4000), 1.0)
                except TimeoutError:
                    pass
            self.kill()
            raise SandboxUnavailable(
                f"the sandboxed python worker did not start: "
                f"{err.decode(errors='replace').strip() or e!r}"
            ) from None
        if not msg.get("ready"):
            self.kill()
            raise SandboxUnavailable(f"unexpected worker greeting {msg!r}")

    def _pipes(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        """The worker's stdin and stdout (both PIPEs once :meth:`start` has run)."""
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise WorkerDied("the worker process is not running")
        return proc.stdin, proc.stdout

    async def _read_header(self) -> dict:
        """One JSON header frame of at most :data:`MAX_HEADER` bytes (a longer one, or one
        that is not a JSON object, means the worker is broken or subverted: WorkerDied)."""
        _, stdout = self._pipes()
        try:
            head = await stdout.readexactly(4)
            n = struct.unpack(">I", head)[0]
            if n > MAX_HEADER:
                raise WorkerDied(f"protocol violation: a {n}-byte header")
            body = await stdout.readexactly(n)
        except asyncio.IncompleteReadError:
            raise WorkerDied("the worker process exited") from None
        try:
            msg = json.loads(body)
        except ValueError:
            raise WorkerDied("protocol violation: a header that is not JSON") from None
        if not isinstance(msg, dict):
            raise WorkerDied("protocol violation: a header that is not an object")
        return msg

    async def _read_reply(self, max_output: int) -> RunResult:
        """A reply: header, then stdout and stderr bytes, each at most ``max_output``."""
        msg = await self._read_header()
        sizes = [msg.pop("stdout_len", None), msg.pop("stderr_len", None)]
        if not all(isinstance(n, int) and 0 <= n <= max_output for n in sizes):
            raise WorkerDied(
                f"protocol violation: output sizes {sizes!r:.80} over the {max_output}-byte cap"
            )
        _, stdout = self._pipes()
        try:
            out = await stdout.readexactly(sizes[0])
            err = await stdout.readexactly(sizes[1])
        except asyncio.IncompleteReadError:
            raise WorkerDied("the worker process exited") from None
        fields = {
            k: msg[k]
            for k in (
                "exit_code",
                "signal",
                "timed_out",
                "truncated",
                "elapsed_s",
                "memory_exceeded",
                "kernel_lost",
            )
            if k in msg
        }
        try:
            return RunResult(
                stdout=out.decode("utf-8", "backslashreplace"),
                stderr=err.decode("utf-8", "backslashreplace"),
                **fields,
            )
        except TypeError:
            raise WorkerDied("protocol violation: a malformed reply") from None

    async def call(
        self, code: str, limits: ResourceLimits, max_output: int, stdin: str | None = None
    ) -> RunResult:
        """Run one snippet (``stdin``: its standard input; None: empty); raises
        :class:`WorkerDied` if the process ends, overruns ``limits.wall_s + BACKSTOP_S``
        or breaks the protocol (then it is killed)."""
        async with self._lock:
            if not self.alive:
                raise WorkerDied("the worker process is not running")
            data = code.encode("utf-8", "surrogatepass")
            stdin_data = (stdin or "").encode("utf-8", "surrogatepass")
            head = json.dumps(
                {
                    "code_len": len(data),
                    "stdin_len": len(stdin_data),
                    "limits": _limits_dict(limits),
                    "max_output": max_output,
                }
            ).encode()
            stdin_pipe, _ = self._pipes()
            try:
                stdin_pipe.write(struct.pack(">I", len(head)) + head)
                stdin_pipe.write(data)
                stdin_pipe.write(stdin_data)
                await stdin_pipe.drain()
                reply = await asyncio.wait_for(
                    self._read_reply(max_output), limits.wall_s + BACKSTOP_S
                )
            except asyncio.CancelledError:
                # the caller gave up mid-call: the reply would reach the next caller
                self.kill()
                raise
            except (ConnectionError, BrokenPipeError):
                self.kill()
                raise WorkerDied("the worker process exited") from None
            except TimeoutError:
                self.kill()
                raise WorkerDied(f"no answer within {limits.wall_s:g} s") from None
            except WorkerDied:
                self.kill()
                raise
            if reply.kernel_lost:
                self.kill()
            return reply

    async def log_stderr(self, why: str) -> None:
        """Log what a dead worker wrote on its stderr (a crash of the worker itself)."""
        proc = self.proc
        if proc is None or proc.stderr is None:
            return
        try:
            err = await asyncio.wait_for(proc.stderr.read(8192), 0.5)
        except (TimeoutError, ValueError, OSError):
            return
        if err.strip():
            log.warning("python worker ended (%s): %s", why, err.decode(errors="replace"))

    def kill(self) -> None:
        """Stop the process (its whole sandbox goes with it) and delete its host dir."""
        self.killed = True
        if self.handle is not None:
            self.handle.kill()  # by pidfd: never a recycled pid
        if self.host_dir is not None:
            shutil.rmtree(self.host_dir, ignore_errors=True)
            self.host_dir = None


class PythonPool:
    """``size`` fork-server workers; :meth:`run` uses an idle one (waiting if none)."""

    def __init__(
        self, size: int, root_dir: str, unsafe: bool = False, tmp_mb: int = DEFAULT_TMP_MB
    ) -> None:
        if size < 1:
            raise ValueError(f"pool size (--workers) must be >= 1, got {size}")
        self.size = size
        self.root_dir = root_dir
        self.unsafe = unsafe
        self.tmp_mb = tmp_mb
        self._idle: asyncio.Queue | None = None
        self._all: list[SandboxProcess] = []
        self.restarts = 0

    async def start(self) -> None:
        self._idle = asyncio.Queue()
        workers = [
            SandboxProcess("fork", self.root_dir, self.unsafe, self.tmp_mb)
            for _ in range(self.size)
        ]
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        for w, r in zip(workers, results):
            if isinstance(r, BaseException):
                log.error("python worker failed to start: %s", r)
            self._all.append(w)
            self._idle.put_nowait(w)

    async def run(
        self, code: str, limits: ResourceLimits, max_output: int = 1 << 20, stdin: str | None = None
    ) -> RunResult:
        if self._idle is None:
            await self.start()
        idle = self._idle
        assert idle is not None  # start() made it
        worker: SandboxProcess = await idle.get()
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
                await worker.log_stderr(str(e))
                return RunResult(error=f"the sandboxed process was killed ({e})")
        finally:
            if worker.alive:
                idle.put_nowait(worker)
            else:
                asyncio.get_running_loop().create_task(self._restart(worker))

    async def _restart(self, worker: SandboxProcess) -> None:
        worker.kill()
        try:
            await worker.start()
        except SandboxUnavailable as e:
            log.error("restarting a python worker failed: %s", e)
        assert self._idle is not None  # the worker came from run(), after start()
        self._idle.put_nowait(worker)

    async def close(self) -> None:
        for w in self._all:
            w.kill()
        self._all.clear()
