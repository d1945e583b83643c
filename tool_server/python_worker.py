"""The sandboxed Python fork server (runs INSIDE bubblewrap; standard library only).

The server starts it once per pool slot as ``python3 -I /opt/verltool/python_worker.py
MODE WORKROOT``. It imports a prelude of common modules, then serves requests read from
its protocol pipe, one at a time: for each it forks a child that applies the resource
limits, gets a fresh private work dir and runs the code; the parent collects stdout/stderr
(capped), enforces the wall-clock limit and the memory budget of the call (the summed
proportional set size of every process of the call, measured every
:data:`MEMORY_POLL_S`), then kills every other process of the sandbox (``kill(-1)``,
possible because the sandbox is its own pid namespace and uid) and scrubs every place a
call can write (the work root, ``/tmp``, SysV IPC objects), so nothing outlives a call.
A call costs a fork, not an interpreter start.

No user data enters the worker's heap, so a forked child cannot find an earlier call's
code or output in the memory it inherits: the code arrives as raw bytes read straight
into a fresh anonymous ``mmap`` (unmapped once the child has it), output is read straight
into per-call ``mmap`` buffers and written back from them.

MODE ``isolated``: inside the sandbox (cleanup by ``kill(-1)``).
MODE ``unsafe``: no sandbox (``--unsafe-no-sandbox``); cleanup by process group only.
MODE ``watch BUDGET_MB -- COMMAND...``: run a command (the ``bash`` and ``run_tests``
sandboxes) under the same measured memory budget over all its processes.
MODE ``kernel`` (``kernel-unsafe`` without a sandbox): stateful, one sandbox per trajectory. This process only speaks the
protocol; the code runs in a forked kernel process (pipes for code, output and status)
that keeps its namespace across calls and never holds the protocol pipe. A call that
times out, exceeds the memory budget or kills the kernel ends the kernel (the reply says
``kernel_lost``) and this process exits.

Frames (both directions): 4-byte big-endian length + UTF-8 JSON header, then raw bytes.
Request header ``{"code_len": int, "stdin_len"?: int, "limits": {...}, "max_output": int}``
+ code (UTF-8) + the program's standard input (``stdin_len`` bytes; absent: /dev/null).
Reply header ``{"stdout_len", "stderr_len", "exit_code", "signal", "timed_out",
"truncated", "memory_exceeded", "kernel_lost", "elapsed_s"}`` + stdout bytes + stderr bytes.
"""

import io
import json
import mmap
import os
import selectors
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
import traceback

PRELUDE = (
    "math",
    "cmath",
    "re",
    "json",
    "itertools",
    "functools",
    "collections",
    "random",
    "fractions",
    "decimal",
    "statistics",
    "datetime",
    "heapq",
    "bisect",
    "string",
    "operator",
    "copy",
    "typing",
    "dataclasses",
    "numbers",
    "linecache",
    "traceback",
    "io",
    "textwrap",
)
CODE_FILE = "main.py"
MAX_HEADER = 1 << 16  # bytes of a JSON header frame
MEMORY_POLL_S = 0.02  # how often the call's memory is measured
WATCH_POLL_S = 0.05  # the same for a shell's processes (MODE watch)
TRACEBACK_LIMIT = 1000  # frames CPython prints for an uncaught exception (the last ones)
SCRUBBED = ("/tmp",)  # besides the work root: every place a call can write


def _read_exact(fd, n):
    chunks = []
    while n:
        b = os.read(fd, n)
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def read_msg(fd):
    """One JSON header frame (``None`` at end of input); a frame over MAX_HEADER ends."""
    head = _read_exact(fd, 4)
    if head is None:
        return None
    n = struct.unpack(">I", head)[0]
    if n > MAX_HEADER:
        return None
    body = _read_exact(fd, n)
    return None if body is None else json.loads(body)


def read_into(fd, buf, n):
    """Read exactly ``n`` bytes from ``fd`` into the writable buffer ``buf``."""
    view = memoryview(buf)
    pos = 0
    while pos < n:
        got = os.readv(fd, [view[pos:n]])
        if not got:
            view.release()
            return False
        pos += got
    view.release()
    return True


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_msg(fd, obj, *payloads):
    """A JSON header frame followed by raw ``payloads`` (buffers, written without copies)."""
    data = json.dumps(obj).encode()
    write_all(fd, struct.pack(">I", len(data)) + data)
    for p in payloads:
        write_all(fd, p)


def read_code(fd, n):
    """The code bytes of a request, in a fresh anonymous mapping (not the heap)."""
    mm = mmap.mmap(-1, max(1, n))
    if not read_into(fd, mm, n):
        mm.close()
        return None
    return mm


def read_request(fd):
    """One request: ``(header, code mapping, stdin bytes)``, or None when the pipe closed."""
    msg = read_msg(fd)
    if msg is None:
        return None
    code_mm = read_code(fd, int(msg["code_len"]))
    if code_mm is None:
        return None
    stdin_data = read_stdin(fd, msg)
    if stdin_data is None:
        code_mm.close()
        return None
    return msg, code_mm, stdin_data


def read_stdin(fd, msg):
    """The standard-input bytes that follow a request's code (b"" when none; None when
    the pipe closed)."""
    n = int(msg.get("stdin_len", 0))
    return _read_exact(fd, n) if n else b""


def apply_limits(limits):
    import resource

    mib = 1024 * 1024
    cpu = max(1, int(round(limits["cpu_s"])))
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits["memory_mb"] * mib,) * 2),
        (resource.RLIMIT_NPROC, (limits["nproc"],) * 2),
        (resource.RLIMIT_NOFILE, (limits["nofile"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["fsize_mb"] * mib,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(res, value)


def _no_ptrace():
    """PR_SET_DUMPABLE=0: code running as the same uid cannot ptrace this process or
    read its memory or fds."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass


def run_user_code(code, namespace):
    """Run ``code`` as ``main.py`` in ``namespace``; print a traceback without our own
    frame on error. Returns the exit status."""
    import linecache

    linecache.cache[CODE_FILE] = (len(code), None, code.splitlines(True), CODE_FILE)
    try:
        exec(compile(code, CODE_FILE, "exec"), namespace)
        return 0
    except SystemExit as e:
        if e.code is None or e.code == 0:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        sys.stderr.write(
            "".join(traceback.format_exception(type(e), e, tb, limit=-TRACEBACK_LIMIT))
        )
        return 1


def stdin_fd(data):
    """A read-only fd positioned at the start of ``data`` (an anonymous in-memory file,
    nothing on disk)."""
    fd = os.memfd_create("stdin")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def fresh_namespace():
    import builtins

    return {"__name__": "__main__", "__builtins__": builtins, "__file__": CODE_FILE}


def _child_setup(out_w, err_w, workdir, close_fds):
    """In a forked child: own session, stdin /dev/null, stdout/stderr to the pipes, the
    protocol and other fds closed, cwd ``workdir``, a normal gc."""
    import gc

    gc.enable()  # the worker runs with gc frozen/disabled; user code gets a normal gc
    os.setsid()
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in set(close_fds) | {devnull, out_w, err_w}:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    os.chdir(workdir)
    # sys.__stdout__/__stderr__ too (typeshed calls them final): code that restores the
    # original streams must get these, not the worker's protocol pipes
    sys.stdout = sys.__stdout__ = open(  # type: ignore[misc]
        1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )
    sys.stderr = sys.__stderr__ = open(  # type: ignore[misc]
        2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )
    sys.argv = [CODE_FILE]
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)


def child_main(code_mm, code_len, limits, out_w, err_w, workdir, close_fds, stdin_data=b""):
    """In the forked child: set up fds, limits and cwd, run the code, exit."""
    try:
        code = bytes(code_mm[:code_len]).decode("utf-8", "replace")
        code_mm.close()
        _child_setup(out_w, err_w, workdir, close_fds)
        if stdin_data:
            fd = stdin_fd(stdin_data)
            os.dup2(fd, 0)
            os.close(fd)
        apply_limits(limits)
        status = run_user_code(code, fresh_namespace())
    except BaseException:
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(status & 0xFF)


def call_memory_bytes(exclude):
    """Summed memory of every process visible here except ``exclude`` (pids): the
    proportional set size (``Pss`` of ``/proc/PID/smaps_rollup``; pages shared by k
    processes count 1/k each), or the resident set size where that file is missing."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            with open(f"/proc/{name}/smaps_rollup", "rb") as f:
                data = f.read(4096)
            i = data.find(b"\nPss:")
            if i >= 0:
                total += int(data[i + 5 : data.index(b"kB", i)]) * 1024
                continue
        except (OSError, ValueError):
            pass
        try:
            with open(f"/proc/{name}/statm", "rb") as f:
                total += int(f.read().split()[1]) * mmap.PAGESIZE
        except (OSError, ValueError, IndexError):
            pass
    return total


class Output:
    """One output stream of a call: up to ``cap`` bytes read straight into a private
    mapping; what comes beyond is read and dropped (``truncated``)."""

    def __init__(self, fd, cap):
        self.fd = fd
        self.cap = cap
        self.mm = mmap.mmap(-1, max(1, cap))
        self.view = memoryview(self.mm)
        self.n = 0
        self.truncated = False
        self.eof = False

    def read(self):
        """Read what is available: ``"data"``, ``"again"`` (nothing now) or ``"eof"``."""
        try:
            if self.n < self.cap:
                got = os.readv(self.fd, [self.view[self.n : self.cap]])
                self.n += got
            else:
                got = len(os.read(self.fd, 65536))
                self.truncated = self.truncated or got > 0
        except BlockingIOError:
            return "again"
        if got == 0:
            self.eof = True
            return "eof"
        return "data"

    def drain(self):
        """Read until the pipe is empty (or closed)."""
        while not self.eof and self.read() == "data":
            pass

    def data(self):
        return self.view[: self.n]

    def close(self):
        self.view.release()
        self.mm.close()


def collect(pid, streams, wall_s, memory_budget, exclude, done_fd=None, stop_on_truncate=True):
    """Read the streams until the process ``pid`` exits (then wait up to 50 ms for the
    pipes to close) or ``done_fd`` turns readable (then take what is in the pipes), the
    wall clock runs out, the output overflows (``stop_on_truncate``) or the memory of the
    processes other than ``exclude`` exceeds ``memory_budget`` bytes (``None``: not
    measured). Returns ``(timed_out, memory_exceeded, finished)``."""
    sel = selectors.DefaultSelector()
    for s in streams:
        os.set_blocking(s.fd, False)
        sel.register(s.fd, selectors.EVENT_READ, s)
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    if done_fd is not None:
        sel.register(done_fd, selectors.EVENT_READ, "done")
    deadline = time.monotonic() + wall_s
    next_poll = time.monotonic() + MEMORY_POLL_S
    timed_out = over = False
    finished = None  # "exit" or "done"
    drain_until = 0.0
    while True:
        now = time.monotonic()
        if finished == "done" or (
            finished == "exit" and (now >= drain_until or all(s.eof for s in streams))
        ):
            break
        if now >= deadline:
            timed_out = finished is None
            break
        limit = deadline
        if finished is not None:
            limit = min(limit, drain_until)
        elif memory_budget is not None:
            if now >= next_poll:
                if call_memory_bytes(exclude) > memory_budget:
                    over = True
                    break
                next_poll = time.monotonic() + MEMORY_POLL_S
            limit = min(limit, next_poll)
        for key, _ in sel.select(max(0.0, limit - now)):
            if key.data in ("exit", "done"):
                sel.unregister(key.fd)
                if finished is None or key.data == "done":
                    finished = key.data
                    drain_until = time.monotonic() + 0.05
                continue
            if key.data.read() == "eof":
                sel.unregister(key.fd)
        if stop_on_truncate and any(s.truncated for s in streams):
            break  # the caller kills the program
    if finished == "done":
        for s in streams:
            s.drain()
    sel.close()
    os.close(pidfd)
    return timed_out, over, finished is not None


def _clear_dir(path, dev=None):
    """Delete what a call left under ``path``, staying on ``path``'s own file system.

    Read-only binds can sit below the sandbox's /tmp (a checkout under /tmp puts its
    venv at /tmp/<repo>/.venv); crossing into them would walk thousands of files that
    cannot be deleted, on every call. Directories holding a mount are kept.
    """
    try:
        dev = os.lstat(path).st_dev if dev is None else dev
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        p = os.path.join(path, name)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if st.st_dev != dev:
            continue  # a mount point: not ours to clear
        if stat.S_ISDIR(st.st_mode):
            try:
                os.chmod(p, 0o700)  # a call may have made it unwritable
            except OSError:
                pass
            _clear_dir(p, dev)
            try:
                os.rmdir(p)
            except OSError:
                pass  # still holds a mount (or was not ours)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


_LIBC: list = []  # the C library (a ctypes.CDLL), loaded on first use


def clear_sysv_ipc():
    """Remove every SysV shared memory segment, message queue and semaphore set (the
    sandbox has its own IPC namespace, shared by the calls of this worker)."""
    for kind, fn in (("shm", "shmctl"), ("msg", "msgctl"), ("sem", "semctl")):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        if rows and not _LIBC:
            try:
                import ctypes

                _LIBC.append(ctypes.CDLL(None, use_errno=True))
            except Exception:
                return
        for row in rows:
            fields = row.split()
            if len(fields) < 2:
                continue
            ident = int(fields[1])
            if kind == "sem":
                _LIBC[0].semctl(ident, 0, 0)  # IPC_RMID = 0
            else:
                getattr(_LIBC[0], fn)(ident, 0, None)


def scrub(workroot):
    """Leave nothing of a call behind: its files in the work root and /tmp, its IPC."""
    _clear_dir(workroot)
    for path in SCRUBBED:
        _clear_dir(path)
    clear_sysv_ipc()


def kill_others(mode, pid):
    """Kill what a call left running: every process of the sandbox but this one and init
    (``kill(-1)``; only inside the sandbox's pid namespace), or the call's process group."""
    if mode in ("isolated", "kernel"):
        try:
            os.kill(-1, signal.SIGKILL)  # everything in the sandbox but us and init
        except ProcessLookupError:
            pass
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def memory_budget_bytes(limits):
    mb = limits.get("total_memory_mb")
    return None if not mb else int(mb) * 1024 * 1024


def serve_fork(proto_in, proto_out, mode, workroot):
    while True:
        req = read_request(proto_in)
        if req is None:
            return
        msg, code_mm, stdin_data = req
        t0 = time.monotonic()
        limits = msg["limits"]
        code_len = int(msg["code_len"])
        workdir = tempfile.mkdtemp(dir=workroot, prefix="run_")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            child_main(
                code_mm,
                code_len,
                limits,
                out_w,
                err_w,
                workdir,
                (proto_in, proto_out, out_r, err_r),
                stdin_data,
            )
        code_mm.close()
        os.close(out_w)
        os.close(err_w)
        cap = int(msg.get("max_output", 1 << 20))
        out, err = Output(out_r, cap), Output(err_r, cap)
        budget = memory_budget_bytes(limits) if mode == "isolated" else None
        timed_out, over, _ = collect(pid, (out, err), limits["wall_s"], budget, {1, os.getpid()})
        kill_others(mode, pid)
        _, status = os.waitpid(pid, 0)
        os.close(out_r)
        os.close(err_r)
        if mode == "isolated":
            scrub(workroot)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        write_msg(
            proto_out,
            {
                "stdout_len": out.n,
                "stderr_len": err.n,
                "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": sig,
                "timed_out": timed_out,
                "truncated": out.truncated or err.truncated,
                "memory_exceeded": over,
                "kernel_lost": False,
                "elapsed_s": round(time.monotonic() - t0, 4),
            },
            out.data(),
            err.data(),
        )
        out.close()
        err.close()


def kernel_main(code_r, status_w, out_w, err_w, workroot, limits, close_fds):
    """The stateful kernel (a child of the protocol process): run each request's code in
    one persistent namespace; after each, flush and write a status frame that echoes the
    request's nonce."""
    import resource

    _child_setup(out_w, err_w, workroot, close_fds)
    lim = dict(limits)
    lim["cpu_s"] = 10**6
    apply_limits(lim)  # memory, processes, files: for the whole kernel
    namespace = fresh_namespace()
    while True:
        msg = read_msg(code_r)
        if msg is None:
            os._exit(0)
        data = _read_exact(code_r, int(msg["code_len"])) if msg["code_len"] else b""
        stdin_data = read_stdin(code_r, msg)
        if data is None or stdin_data is None:
            os._exit(0)
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime + msg["limits"]["cpu_s"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, 10**6))
        nonce = msg["nonce"]
        sys.stdin = io.StringIO(stdin_data.decode("utf-8", "replace"))
        status = run_user_code(data.decode("utf-8", "replace"), namespace)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        write_msg(status_w, {"exit_code": status, "nonce": nonce})


def serve_kernel(proto_in, proto_out, mode, workroot):
    """Stateful: start the kernel process on the first request, then relay each request
    to it and its output and status back; the kernel never sees the protocol pipe.

    The kernel's status pipe is written by the process that runs the code, so a status
    frame is believed only if it is exactly ``{"exit_code": int, "nonce": <this call's
    nonce>}`` and nothing follows it; anything else ends the kernel (``kernel_lost``)."""
    kernel = None
    while True:
        req = read_request(proto_in)
        if req is None:
            return
        msg, code_mm, stdin_data = req
        t0 = time.monotonic()
        limits = msg["limits"]
        code_len = int(msg["code_len"])
        if kernel is None:
            code_r, code_w = os.pipe()
            status_r, status_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                kernel_main(
                    code_r,
                    status_w,
                    out_w,
                    err_w,
                    workroot,
                    limits,
                    (proto_in, proto_out, code_w, status_r, out_r, err_r),
                )
            for fd in (code_r, status_w, out_w, err_w):
                os.close(fd)
            kernel = (pid, code_w, status_r, out_r, err_r)
        pid, code_w, status_r, out_r, err_r = kernel
        cap = int(msg.get("max_output", 1 << 20))
        out, err = Output(out_r, cap), Output(err_r, cap)
        nonce = os.urandom(16).hex()
        lost = timed_out = over = False
        exit_code = sig = None
        try:
            write_msg(
                code_w,
                {
                    "code_len": code_len,
                    "stdin_len": len(stdin_data),
                    "limits": limits,
                    "nonce": nonce,
                },
                memoryview(code_mm)[:code_len],
                stdin_data,
            )
        except OSError:
            lost = True
        code_mm.close()
        if not lost:
            timed_out, over, finished = collect(
                pid,
                (out, err),
                limits["wall_s"],
                memory_budget_bytes(limits) if mode == "kernel" else None,
                {1, os.getpid()},
                done_fd=status_r,
                stop_on_truncate=False,
            )
            reply = read_msg(status_r) if finished and _readable(status_r) else None
            if (
                isinstance(reply, dict)
                and set(reply) == {"exit_code", "nonce"}
                and reply["nonce"] == nonce
                and isinstance(reply["exit_code"], int)
                and not _readable(status_r)
            ):
                exit_code = reply["exit_code"]
            else:
                lost = True
        if lost or timed_out or over:
            lost = True
            done, status = os.waitpid(pid, os.WNOHANG)
            kill_others(mode, pid)
            if not done:
                os.waitpid(pid, 0)
            elif not (timed_out or over):  # it ended by itself: say how
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                elif os.WIFEXITED(status):
                    exit_code = os.WEXITSTATUS(status)
        write_msg(
            proto_out,
            {
                "stdout_len": out.n,
                "stderr_len": err.n,
                "exit_code": exit_code,
                "signal": sig,
                "timed_out": timed_out,
                "truncated": out.truncated or err.truncated,
                "memory_exceeded": over,
                "kernel_lost": lost,
                "elapsed_s": round(time.monotonic() - t0, 4),
            },
            out.data(),
            err.data(),
        )
        out.close()
        err.close()
        if lost:
            return


def _readable(fd):
    """Whether ``fd`` has data (or end of file) to read now."""
    os.set_blocking(fd, True)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    ok = bool(sel.select(0))
    sel.close()
    return ok


def serve_watch(budget_mb, argv):
    """MODE ``watch``: run ``argv`` (a shell, a test command) as a child and keep the
    memory of every other process of the sandbox under ``budget_mb`` MiB (measured every
    :data:`WATCH_POLL_S`, as in :func:`call_memory_bytes`). Past it every process is
    killed, a note goes to stderr, and this exits 137; otherwise it exits as the child.
    The child inherits stdin, stdout and stderr untouched."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    sel.register(pidfd, selectors.EVENT_READ)
    budget = budget_mb * 1024 * 1024
    while True:
        if sel.select(WATCH_POLL_S):
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status))
        if call_memory_bytes({1, os.getpid()}) > budget:
            kill_others("isolated", pid)
            os.waitpid(pid, 0)
            try:
                os.write(
                    2,
                    f"\n[MemoryError: the processes used more than {budget_mb} MB "
                    "together and were all killed]\n".encode(),
                )
            except OSError:
                pass
            os._exit(137)


def main():
    if sys.argv[1] == "watch":
        if len(sys.argv) < 5 or sys.argv[3] != "--":
            sys.exit("usage: python_worker.py watch BUDGET_MB -- COMMAND...")
        serve_watch(int(sys.argv[2]), sys.argv[4:])
    mode, workroot = sys.argv[1], sys.argv[2]
    # protocol on private fds; fd 0/1 no longer reach the server
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    _no_ptrace()
    for name in PRELUDE:
        try:
            __import__(name)
        except ImportError:
            pass
    kernel = mode.startswith("kernel")  # "kernel" (sandboxed) or "kernel-unsafe"
    signal.signal(signal.SIGPIPE, signal.SIG_IGN if kernel else signal.SIG_DFL)
    os.makedirs(workroot, exist_ok=True)
    import gc

    gc.collect()
    gc.freeze()  # children do not scan (and so do not copy) the worker's objects
    write_msg(proto_out, {"ready": True, "pid": os.getpid()})
    if kernel:
        serve_kernel(proto_in, proto_out, mode, workroot)
    else:
        serve_fork(proto_in, proto_out, mode, workroot)


if __name__ == "__main__":
    main()
