"""What a killed run leaves behind: start a command, SIGKILL it at a chosen moment, list
every process it started that is still alive.

    python tests/support/orphans.py --when step --out RUN_DIR [--grace 20] -- CMD ...

This script makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every process
the command starts, at any depth, stays its descendant even after its parent dies (an
orphan is re-parented here instead of to init); the descendants are found by their parent
chain in ``/proc``, whatever their process group, session or environment. ``--when``:

* ``step``: once ``RUN_DIR/metrics.jsonl`` has a step record (the run is in its next step);
* ``tool_call``: once a sandboxed Python call is running (a forked call process of the
  tool server's Python fork server);
* a number: that many seconds after the start.

It prints one JSON object: ``before`` (the descendants just before the kill, pid and
command), ``left`` (those alive ``--grace`` seconds after it, zombies reaped), ``waited_s``
and the command's output tail.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, command line) of every process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read(f"/proc/{name}/stat")
        if not stat:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        cmd = _read(f"/proc/{name}/cmdline").replace(b"\0", b" ").decode(errors="replace")
        out[int(name)] = (int(fields[1]), fields[0].decode(), cmd.strip())
    return out


def descendants(root: int) -> dict[int, str]:
    """pid -> command of every live (not zombie) descendant of ``root``."""
    procs = processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        ppid, state, cmd = procs[pid]
        if state != "Z":
            found[pid] = cmd
        todo += children.get(pid, [])
    return found


def tool_call_running(root: int) -> bool:
    """A forked call process of the sandboxed Python fork server is alive under ``root``."""
    procs = processes()
    mine = descendants(root)

    def worker(cmd: str) -> bool:
        return "python_worker.py" in cmd and os.path.basename(cmd.split()[0]).startswith("python")

    return any(
        worker(cmd) and worker(procs.get(procs[pid][0], (0, "", ""))[2])
        for pid, cmd in mine.items()
        if pid in procs
    )


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--when", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--grace", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    me = os.getpid()
    log_path = os.path.join(a.out, "orphans_probe.log")
    os.makedirs(a.out, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    metrics = os.path.join(a.out, "metrics.jsonl")
    reason = None
    while reason is None:
        if proc.poll() is not None:
            reason = f"the command exited by itself (code {proc.returncode}) before the kill"
            break
        if time.monotonic() - t0 > a.timeout:
            reason = "timeout"
            break
        if a.when == "step":
            if b'"policy/version"' in _read(metrics):
                break
        elif a.when == "tool_call":
            if tool_call_running(me):
                break
        elif time.monotonic() - t0 >= float(a.when):
            break
        time.sleep(0.02)
    before = descendants(me)
    before.pop(proc.pid, None)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t_kill = time.monotonic()
    left = descendants(me)
    while left and time.monotonic() - t_kill < a.grace:
        time.sleep(0.1)
        reap()
        left = descendants(me)
    waited = time.monotonic() - t_kill
    # the test owns what is left: end it now that it has been counted
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.2)
    reap()
    print(
        json.dumps(
            {
                "killed_at_s": round(t_kill - t0, 2),
                "not_killed_because": reason,
                "before": {str(k): v for k, v in before.items()},
                "left": {str(k): v for k, v in left.items()},
                "waited_s": round(waited, 2),
                "output_tail": _read(log_path).decode(errors="replace")[-3000:],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
