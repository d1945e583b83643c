"""The lifeline (verltool_jax/runtime/lifeline.py): a process that armed it is killed (SIGKILL,
or a plain exit) and every process it started, in any session, at any depth, is gone a
moment later; with it off they stay (the test can fail). The real trainer killed mid-step
and mid-tool-call: tests/train/test_no_orphans.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verltool_jax.runtime import lifeline

REPO = Path(__file__).resolve().parents[1]

# A stand-in for the trainer: arms the lifeline, starts a child in a new session, a
# grandchild that its parent abandons at once (double fork), and a nested "run" that arms
# its own lifeline and starts a child; prints their pids, then waits or exits.
FAKE_RUN = r"""
import json, os, subprocess, sys, time
from verltool_jax.runtime import lifeline
lifeline.arm()
child = subprocess.Popen(["sleep", "300"], start_new_session=True)
r, w = os.pipe()
shell = subprocess.Popen(["sh", "-c", "sleep 300 & echo $! >&%d" % w], pass_fds=[w])
shell.wait()
os.close(w)
orphan = int(os.read(r, 64).decode())
nested = subprocess.Popen(
    [sys.executable, "-c",
     "import subprocess, sys; from verltool_jax.runtime import lifeline; lifeline.arm(); "
     "p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
nested_child = int(nested.stdout.readline())
print(json.dumps([child.pid, orphan, nested.pid, nested_child]), flush=True)
if sys.argv[1] == "wait":
    time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def _start(mode: str, off: bool = False) -> tuple[subprocess.Popen, list[int]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(lifeline.ENV, None)  # a lifeline armed by an earlier test in this process
    if off:
        env[lifeline.OFF_ENV] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_RUN, mode], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    return proc, json.loads(proc.stdout.readline())


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _cleanup(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


pytestmark = pytest.mark.skipif(not lifeline.supported(), reason="needs Linux /proc and pidfd")


def test_sigkill_of_the_run_kills_everything_it_started():
    proc, pids = _start("wait")
    try:
        assert all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _wait_gone(pids) == []
    finally:
        _cleanup(pids)


def test_a_plain_exit_leaves_nothing_either():
    proc, pids = _start("exit")
    try:
        assert proc.wait() == 0
        assert _wait_gone(pids) == []
    finally:
        _cleanup(pids)


def test_with_the_lifeline_off_the_children_stay():
    proc, pids = _start("wait", off=True)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(1.0)
        # the nested run (off too: the switch is inherited) ends itself when its stdin
        # closes; what the two runs started stays
        child, orphan, _, nested_child = pids
        assert [p for p in pids if _alive(p)] == [child, orphan, nested_child]
    finally:
        _cleanup(pids)


def test_the_nested_run_dies_with_its_own_lifeline_alone():
    """Killing only the inner run ends its child, not the outer run's."""
    proc, (child, orphan, nested, nested_child) = _start("wait")
    try:
        os.kill(nested, signal.SIGKILL)
        assert _wait_gone([nested_child]) == []
        assert _alive(child) and _alive(orphan)
    finally:
        proc.kill()
        proc.wait()
        _cleanup([child, orphan, nested, nested_child])
    assert _wait_gone([child, orphan]) == []


def test_arm_is_once_per_process_and_tokens_nest(monkeypatch):
    monkeypatch.setenv(lifeline.ENV, "outer-token")
    monkeypatch.setattr(lifeline, "_armed", {})
    token = lifeline.arm()
    try:
        assert token and lifeline.arm() == token
        assert os.environ[lifeline.ENV] == f"outer-token,{token}"
        watchdog = lifeline._armed[os.getpid()][1]
        assert lifeline.tokens_of(watchdog.pid) == {"outer-token"}  # never its own token
    finally:
        watchdog.kill()
        watchdog.wait()
