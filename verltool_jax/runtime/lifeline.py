"""Nothing left behind: every process a run starts dies with it, ``kill -9`` included.

:func:`arm` is called once per process before a run starts any other process
(``train.build.build_run`` does it). It

1. adds a fresh token to ``VERLTOOL_LIFELINE`` in this process's environment (a
   comma-separated list: a run started by another run carries both tokens). Every process
   started afterwards inherits it, however it is started and by whom: the tool server and
   the bubblewrap of each sandbox, vLLM's engine core (spawned by vLLM), the reward
   workers (spawned by ``multiprocessing``), their compile workers;
2. starts a watchdog, ``python -m verltool_jax.runtime.lifeline --pid P --start-time T --token K``,
   in its own session (a Ctrl-C or a ``kill`` of the run's process group leaves it
   alone), and waits until it watches. The watchdog holds a pidfd of the run's process,
   which becomes readable when that process has exited for any reason (a normal exit, an
   exception, SIGKILL, the OOM killer); it then SIGKILLs every process whose environment
   carries the token, scanning ``/proc`` until none is left, and exits.

Why not ``PR_SET_PDEATHSIG`` in each child: the signal follows the *thread* that started
the child, and the trainer starts the reward pool and restarts the tool server from worker
threads (``asyncio.to_thread``), so a child would die when that thread ends; and vLLM's
engine core is started by vLLM, where we cannot set it. Processes inside a sandbox, whose
environment bubblewrap clears, die with their bubblewrap (``--die-with-parent`` and the
end of the sandbox's pid namespace).

Limits: the watchdog itself killed with SIGKILL (or the whole machine going down) leaves
nothing to clean up; a child that replaces its whole environment (a sandbox's inside, see
above) is not seen by the scan. Other platforms (no ``/proc`` or no ``pidfd_open``, e.g.
macOS): :func:`arm` says so once and does nothing; the run still stops everything it
started on every orderly exit (an exception, Ctrl-C, SIGTERM) through its context managers,
but a ``kill -9`` leaves its children running.

``VERLTOOL_LIFELINE_OFF=1`` turns it off (to reproduce the orphans in a test).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import select
import signal
import subprocess
import sys
import time

ENV = "VERLTOOL_LIFELINE"
OFF_ENV = "VERLTOOL_LIFELINE_OFF"
READY = "LIFELINE_READY"

log = logging.getLogger("verltool_jax.runtime.lifeline")

_armed: dict[int, tuple[str, subprocess.Popen]] = {}  # pid -> (token, watchdog)


def supported() -> bool:
    """Linux with ``/proc`` and ``os.pidfd_open`` (kernel >= 5.3, Python >= 3.9)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and os.path.isdir("/proc")


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    which tells a process from a later one that reuses its pid; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    return int(stat.rsplit(b")", 1)[1].split()[19])


def tokens_of(pid: int) -> set[str]:
    """The lifeline tokens in the environment ``pid`` was started with (empty if it has
    none, is gone, is a zombie or is not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return set()
    prefix = ENV.encode() + b"="
    for entry in env.split(b"\0"):
        if entry.startswith(prefix):
            return set(entry[len(prefix) :].decode(errors="replace").split(","))
    return set()


def carriers(token: str, exclude: frozenset[int] = frozenset()) -> list[int]:
    """The pids of the processes whose environment carries ``token``."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in exclude and token in tokens_of(int(name)):
            pids.append(int(name))
    return pids


def kill_carriers(token: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process carrying ``token`` (but this one), scanning again until a
    scan finds none or ``timeout_s`` passes (a process may start another while it is
    being killed); the pids killed."""
    me = frozenset({os.getpid()})
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        found = carriers(token, me)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        if not found or time.monotonic() > deadline:
            return killed
        time.sleep(0.05)


def wait_for_exit(pid: int, started: int) -> None:
    """Block until process ``pid`` (started at ``started``, see :func:`start_time`) exits;
    return at once if it already has."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if start_time(pid) != started:  # it died and its pid was reused before we looked
            return
        print(READY, flush=True)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
    finally:
        os.close(fd)


def arm(timeout_s: float = 30.0) -> str | None:
    """Start this process's watchdog (once per process) and put its token in the
    environment; the token, or None where it is off or unsupported (see the module)."""
    pid = os.getpid()
    if pid in _armed:
        return _armed[pid][0]
    if os.environ.get(OFF_ENV) == "1":
        return None
    if not supported():
        log.warning(
            "processes this run starts are stopped on orderly exits only: a kill -9 of the "
            "run may leave them running on this platform (%s; needs Linux /proc and "
            "os.pidfd_open)",
            sys.platform,
        )
        return None
    token = f"{pid}-{secrets.token_hex(8)}"
    started = start_time(pid)
    outer = os.environ.get(ENV, "")
    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "verltool_jax.runtime.lifeline",
            "--pid",
            str(pid),
            "--start-time",
            str(started),
            "--token",
            token,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # the watchdog carries the outer runs' tokens (they clean it up too), not its own
        env={**os.environ, ENV: outer}
        if outer
        else {k: v for k, v in os.environ.items() if k != ENV},
        # the folder that holds the verltool_jax package, so -m finds it uninstalled
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    line = _read_line(watchdog, timeout_s)
    if line.strip() != READY:
        watchdog.kill()
        watchdog.wait()
        raise RuntimeError(
            f"the lifeline watchdog did not start (exit {watchdog.poll()}, said {line!r}); "
            f"set {OFF_ENV}=1 to run without it (a kill -9 may then leave processes behind)"
        )
    assert watchdog.stdout is not None  # stdout=PIPE
    watchdog.stdout.close()
    os.environ[ENV] = f"{outer},{token}" if outer else token
    _armed[pid] = (token, watchdog)
    return token


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    out = proc.stdout
    assert out is not None  # started with stdout=PIPE
    ready, _, _ = select.select([out], [], [], timeout_s)
    return out.readline() if ready else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verltool_jax.runtime.lifeline", description=__doc__)
    p.add_argument("--pid", type=int, required=True, help="the process to watch")
    p.add_argument("--start-time", type=int, required=True, help="its /proc stat start time")
    p.add_argument("--token", required=True, help="the token its children carry")
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    wait_for_exit(a.pid, a.start_time)
    killed = kill_carriers(a.token)
    if killed:
        try:
            print(
                f"[lifeline] process {a.pid} exited; killed {len(killed)} processes it left "
                f"behind: {killed}",
                file=sys.stderr,
                flush=True,
            )
        except OSError:  # its terminal or log may be gone with it
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
