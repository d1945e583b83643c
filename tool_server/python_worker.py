"""The sandboxed Python fork server (runs INSIDE bubblewrap; standard library only).

The server starts it once per pool slot as ``python -I -c <this file's source> MODE
WORKROOT``. It imports a prelude of common modules, then serves requests read from
stdin, one at a time: for each it forks a child that applies the resource limits,
gets a fresh private work dir and runs the code; the parent collects stdout/stderr
(capped), enforces the wall-clock limit, then kills every other process of the
sandbox (``kill(-1)``, possible because the sandbox is its own pid namespace and uid)
and deletes the work dir, so nothing outlives a call. A call costs a fork, not an
interpreter start.

MODE ``isolated``: inside the sandbox (cleanup by ``kill(-1)``).
MODE ``unsafe``: no sandbox (``--unsafe-no-sandbox``); cleanup by process group only.
MODE ``kernel``: stateful, one process per trajectory; code runs in-process in a
persistent namespace (variables survive across calls); the server kills it on timeout.

Frames (both directions): 4-byte big-endian length + UTF-8 JSON.
Request ``{"code": str, "limits": {...}, "max_output": int, "stdin"?: str}`` (``stdin``:
the program's standard input; absent: /dev/null); reply ``{"stdout", "stderr",
"exit_code", "signal", "timed_out", "truncated", "elapsed_s"}``.
"""
import io
import json
import os
import selectors
import shutil
import stat
import signal
import struct
import sys
import tempfile
import time
import traceback

PRELUDE = ("math", "cmath", "re", "json", "itertools", "functools", "collections",
           "random", "fractions", "decimal", "statistics", "datetime", "heapq", "bisect",
           "string", "operator", "copy", "typing", "dataclasses", "numbers", "linecache",
           "traceback", "io", "textwrap")
CODE_FILE = "main.py"
TRACEBACK_LIMIT = 1000  # frames CPython prints for an uncaught exception (the last ones)


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
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def write_msg(fd, obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def apply_limits(limits):
    import resource
    mib = 1024 * 1024
    cpu = max(1, int(round(limits["cpu_s"])))
    for res, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_AS, (limits["memory_mb"] * mib,) * 2),
                       (resource.RLIMIT_NPROC, (limits["nproc"],) * 2),
                       (resource.RLIMIT_NOFILE, (limits["nofile"],) * 2),
                       (resource.RLIMIT_FSIZE, (limits["fsize_mb"] * mib,) * 2),
                       (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(res, value)


def _no_ptrace():
    """PR_SET_DUMPABLE=0: code running as the same uid cannot ptrace this process or
    read its memory (it would see other calls' code)."""
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
        sys.stderr.write("".join(traceback.format_exception(type(e), e, tb,
                                                            limit=-TRACEBACK_LIMIT)))
        return 1


def fresh_namespace():
    import builtins
    return {"__name__": "__main__", "__builtins__": builtins, "__file__": CODE_FILE}


def stdin_fd(text):
    """A read-only fd positioned at the start of ``text`` (an anonymous in-memory file,
    nothing on disk), or None when ``text`` is None."""
    if text is None:
        return None
    fd = os.memfd_create("stdin")
    data = text.encode("utf-8", "surrogateescape")
    while data:
        data = data[os.write(fd, data):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def child_main(code, limits, out_w, err_w, workdir, keep_fds, in_fd=None):
    """In the forked child: set up fds, limits and cwd, run the code, exit."""
    import gc
    gc.enable()  # the worker runs with gc frozen/disabled; user code gets a normal gc
    try:
        os.setsid()
        os.dup2(in_fd if in_fd is not None else os.open("/dev/null", os.O_RDONLY), 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in keep_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        os.chdir(workdir)
        # sys.stdout/err already wrap fds 1/2, which now are the pipes
        sys.stdout.reconfigure(line_buffering=True, errors="backslashreplace")
        sys.stderr.reconfigure(line_buffering=True, errors="backslashreplace")
        sys.argv = [CODE_FILE]
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


def collect(pid, out_r, err_r, wall_s, max_output):
    """Read the child's output until it exits (or the wall clock runs out)."""
    sel = selectors.DefaultSelector()
    bufs = {out_r: bytearray(), err_r: bytearray()}
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ)
    deadline = time.monotonic() + wall_s
    timed_out = truncated = False
    exited = False
    open_pipes = 2
    drain_until = None
    while open_pipes:
        now = time.monotonic()
        if drain_until is not None and now >= drain_until:
            break  # exited; the pipes are held open by a leftover process
        if now >= deadline:
            timed_out = not exited
            break
        limit = deadline if drain_until is None else min(deadline, drain_until)
        for key, _ in sel.select(max(0.0, limit - now)):
            fd = key.fd
            if fd == pidfd:
                exited = True
                sel.unregister(pidfd)
                drain_until = time.monotonic() + 0.05
                continue
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(fd)
                open_pipes -= 1
                continue
            room = max_output - len(bufs[fd])
            if room > 0:
                bufs[fd] += data[:room]
            if len(data) > room:
                truncated = True   # stop here: the caller kills the program
        if truncated:
            break
    sel.close()
    os.close(pidfd)
    return bufs[out_r], bufs[err_r], timed_out, truncated


def read_requests(fd):
    """Each request message read from ``fd``, until the server closes it."""
    while True:
        msg = read_msg(fd)
        if msg is None:
            return
        yield msg


def serve_fork(proto_in, proto_out, mode, workroot):
    for msg in read_requests(proto_in):
        t0 = time.monotonic()
        limits = msg["limits"]
        workdir = tempfile.mkdtemp(dir=workroot, prefix="run_")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_fd = stdin_fd(msg.get("stdin"))
        pid = os.fork()
        if pid == 0:
            child_main(msg["code"], limits, out_w, err_w, workdir,
                       (proto_in, proto_out, out_r, err_r), in_fd)
        os.close(out_w)
        os.close(err_w)
        if in_fd is not None:
            os.close(in_fd)
        out, err, timed_out, truncated = collect(pid, out_r, err_r, limits["wall_s"],
                                                 msg.get("max_output", 1 << 20))
        if mode == "isolated":
            try:
                os.kill(-1, signal.SIGKILL)  # everything in the sandbox but us and init
            except ProcessLookupError:
                pass
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _, status = os.waitpid(pid, 0)
        os.close(out_r)
        os.close(err_r)
        shutil.rmtree(workdir, ignore_errors=True)
        if mode == "isolated":
            _clear_dir("/tmp")
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        write_msg(proto_out, {
            "stdout": out.decode("utf-8", "backslashreplace"),
            "stderr": err.decode("utf-8", "backslashreplace"),
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": sig, "timed_out": timed_out, "truncated": truncated,
            "elapsed_s": round(time.monotonic() - t0, 4)})


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
            continue                      # a mount point: not ours to clear
        if stat.S_ISDIR(st.st_mode):
            _clear_dir(p, dev)
            try:
                os.rmdir(p)
            except OSError:
                pass                      # still holds a mount (or was not ours)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def serve_kernel(proto_in, proto_out, workroot):
    """Stateful: run each call in this process, in one persistent namespace."""
    import contextlib
    import resource
    os.chdir(workroot)
    namespace = fresh_namespace()
    first = True
    for msg in read_requests(proto_in):
        t0 = time.monotonic()
        limits = msg["limits"]
        if first:  # memory, processes, files: for the whole kernel
            lim = dict(limits)
            lim["cpu_s"] = 10 ** 6
            apply_limits(lim)
            first = False
        used = resource.getrusage(resource.RUSAGE_SELF)
        used_s = used.ru_utime + used.ru_stime
        soft = int(used_s + limits["cpu_s"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, 10 ** 6))
        out, err = io.StringIO(), io.StringIO()
        saved_stdin = sys.stdin
        sys.stdin = io.StringIO(msg.get("stdin") or "")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = run_user_code(msg["code"], namespace)
        finally:
            sys.stdin = saved_stdin
        cap = msg.get("max_output", 1 << 20)
        o, e = out.getvalue(), err.getvalue()
        write_msg(proto_out, {
            "stdout": o[:cap], "stderr": e[:cap], "exit_code": status, "signal": None,
            "timed_out": False, "truncated": len(o) > cap or len(e) > cap,
            "elapsed_s": round(time.monotonic() - t0, 4)})


def main():
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
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.makedirs(workroot, exist_ok=True)
    import gc
    gc.collect()
    gc.freeze()    # children do not scan (and so do not copy) the worker's objects
    write_msg(proto_out, {"ready": True, "pid": os.getpid()})
    if mode == "kernel":
        serve_kernel(proto_in, proto_out, workroot)
    else:
        serve_fork(proto_in, proto_out, mode, workroot)


if __name__ == "__main__":
    main()
