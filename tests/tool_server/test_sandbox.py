"""The bubblewrap sandbox, for real: direct use of ``bwrap_argv`` and escape attempts
through a running tool server (python_code). After every attempt the server is healthy."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid

import psutil
import pytest
from support.tool_server import obs_text, one

import tool_server
from tool_server.launcher import get_json, run_server
from tool_server.sandbox import (
    ResourceLimits,
    SandboxUnavailable,
    bwrap_argv,
    require_sandbox,
    sandbox_status,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(tool_server.__file__)))
LIMITS = {
    "python_memory_mb": 256,
    "python_nproc": 32,
    "python_cpu_s": 1,
    "python_fsize_mb": 8,
    "python_nofile": 64,
}


@pytest.fixture(scope="module")
def server():
    with run_server(["python_code"], timeout=3, workers=2, tool_opt=LIMITS) as url:
        yield url


def run(url, code, tid="sb"):
    obs, done, valid = one(url, tid, f"<python>{code}</python>")
    assert valid and not done
    assert get_json(url + "/health")["status"] == "ok"
    return obs_text(obs)


def test_sandbox_is_usable_here():
    ok, why = sandbox_status(refresh=True)
    assert ok, why
    require_sandbox()


def test_bwrap_argv_isolates_a_plain_command(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    argv = bwrap_argv(str(work), limits=ResourceLimits(cpu_s=2, wall_s=5))
    script = (
        f"cat {secret} || echo no-secret; cat {REPO}/pyproject.toml || echo no-repo; "
        "ls /root /home 2>&1; echo hi > out.txt && echo wrote; "
        "touch /usr/x 2>&1 || echo ro-usr; pwd; prlimit --cpu --noheadings"
    )
    r = subprocess.run(argv + ["sh", "-c", script], capture_output=True, text=True, timeout=10)
    out = r.stdout + r.stderr
    assert "s3cret" not in out and "no-secret" in out and "no-repo" in out
    assert "[project]" not in out
    assert "wrote" in out and (work / "out.txt").read_text() == "hi\n"
    assert "ro-usr" in out and "/workspace" in out
    assert " 2 " in out or "2 3" in out.replace("\t", " ")


def test_resource_limits_validate_fields():
    with pytest.raises(ValueError, match="memory_mb"):
        ResourceLimits(memory_mb=0)
    with pytest.raises(ValueError, match="workdir"):
        bwrap_argv("/no/such/dir", limits=None)
    assert ResourceLimits(cpu_s=3).prlimit_argv()[1] == "--cpu=3:4"


def test_cannot_read_private_files(server, tmp_path):
    secret = tmp_path / "private.txt"
    secret.write_text("TOP-SECRET")
    out = run(
        server,
        f"""
import os
for p in [{str(secret)!r}, {REPO + "/pyproject.toml"!r}, {REPO + "/tool_server/app.py"!r},
          '/root/.bashrc', '/root/.ssh', '/etc/shadow', '/home']:
    try:
        print(p, 'READ', open(p).read()[:20])
    except Exception as e:
        print(p, 'DENIED', type(e).__name__)
print('root has', sorted(os.listdir('/root')))
print('work has', sorted(os.listdir('/work')) if os.path.exists('/work') else [])
""",
    )
    assert "TOP-SECRET" not in out and "READ" not in out, out
    assert out.count("DENIED") == 7
    assert "root has ['.pyenv']" in out or "root has []" in out
    assert "main" not in out.split("work has")[1] or ".venv" not in out  # only the venv path


def test_cannot_write_outside_workdir(server):
    marker = f"escape_{uuid.uuid4().hex}"
    out = run(
        server,
        f"""
for p in ['/usr/{marker}', '/etc/{marker}', '/{marker}', '{REPO}/{marker}',
          '/root/{marker}']:
    try:
        open(p, 'w').write('x'); print(p, 'WROTE')
    except Exception as e:
        print(p, 'DENIED', type(e).__name__)
open('/tmp/{marker}', 'w').write('x')          # the sandbox's private /tmp
open('local.txt', 'w').write('ok'); print('workdir ok')
""",
    )
    assert "WROTE" not in out and out.count("DENIED") == 5, out
    assert "workdir ok" in out
    for p in (f"/tmp/{marker}", f"/{marker}", f"{REPO}/{marker}", f"/usr/{marker}"):
        assert not os.path.exists(p)


def test_files_do_not_survive_between_calls(server):
    run(server, "open('keep.txt','w').write('x'); open('/tmp/keep2','w').write('y')", tid="a")
    out = run(
        server,
        "import os; print(os.path.exists('keep.txt'), os.path.exists('/tmp/keep2'))",
        tid="a",
    )
    assert out.strip() == "False False"


def test_cannot_open_a_socket_to_the_host(server):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    got = []

    def accept():
        end = time.monotonic() + 4
        while time.monotonic() < end:
            try:
                got.append(listener.accept())
            except TimeoutError:
                pass

    th = threading.Thread(target=accept)
    th.start()
    out = run(
        server,
        f"""
import socket
for host in ['127.0.0.1', 'localhost', '8.8.8.8']:
    try:
        s = socket.create_connection((host, {port}), timeout=1); print(host, 'CONNECTED')
    except Exception as e:
        print(host, 'BLOCKED', type(e).__name__)
""",
    )
    th.join()
    listener.close()
    assert "CONNECTED" not in out and out.count("BLOCKED") == 3, out
    assert got == []


def _host_procs(pattern: str) -> list:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if pattern in " ".join(p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_fork_bomb_is_contained(server):
    before = len(psutil.pids())
    t0 = time.monotonic()
    out = run(
        server,
        """
import os
n = 0
while True:
    try:
        os.fork(); n += 1
    except OSError:
        pass
""",
    )
    assert time.monotonic() - t0 < 6
    # the wall clock, a resource limit or the call's memory budget stops it
    assert "TimeoutError" in out or "Killed" in out or "MemoryError" in out, out
    time.sleep(0.3)
    assert len(psutil.pids()) < before + 10
    assert run(server, "print(1+1)").strip() == "2"


def test_memory_exhaustion_is_a_memoryerror(server):
    out = run(server, "x = bytearray(1024 * 1024 * 1024)")
    assert "MemoryError" in out
    assert run(server, "print(sum(range(10)))").strip() == "45"


def test_cpu_limit_and_wall_timeout(server):
    t0 = time.monotonic()
    out = run(server, "import resource; print(resource.getrlimit(resource.RLIMIT_CPU))")
    assert out.strip() == "(1, 2)"  # cpu_s = 1: SIGXCPU at 1 s, SIGKILL at 2 s
    out = run(server, "while True: pass")  # on a busy machine the wall clock may win
    assert "SIGXCPU" in out or "SIGKILL" in out or "TimeoutError" in out, out
    assert time.monotonic() - t0 < 3.5
    t0 = time.monotonic()
    out = run(server, "import time; print('start', flush=True); time.sleep(100)")
    assert "start" in out and "TimeoutError" in out and "2.5 s" in out
    assert time.monotonic() - t0 < 4


def test_background_process_does_not_outlive_the_call(server):
    tag = f"sleep {1000 + os.getpid() % 1000}.5"
    out = run(server, f"import subprocess; subprocess.Popen({tag.split()!r}); print('spawned')")
    assert "spawned" in out
    time.sleep(0.3)
    assert _host_procs(tag) == []


def test_file_size_and_open_file_limits(server):
    out = run(server, "open('big', 'wb').write(b'0' * (64 * 1024 * 1024))")  # fsize 8 MiB
    assert "File too large" in out or "SIGXFSZ" in out, out
    out = run(server, "fs = [open('f%d' % i, 'w') for i in range(500)]")  # nofile 64
    assert "Too many open files" in out, out


def test_killing_the_worker_yields_an_observation_and_recovers(server):
    out = run(server, "import os, signal; os.kill(os.getppid(), signal.SIGKILL)")
    assert "killed" in out.lower()
    for _ in range(4):  # every worker (2) is healthy again
        assert run(server, "print('alive')").strip() == "alive"


def test_fail_closed_when_bubblewrap_is_missing():
    env = {"VERLTOOL_BWRAP": "/nonexistent/bwrap"}
    with run_server(["python_code"], env=env, workers=1) as url:
        obs, done, valid = one(url, "x", "<python>print('ran')</python>")
        assert not valid and obs["invalid_reason"] == "sandbox_unavailable"
        assert "Refusing to run code" in obs["obs"] and "bwrap" in obs["obs"]
        assert "ran" not in obs["obs"].replace("Refusing", "")
        assert get_json(url + "/health")["status"] == "ok"
    with run_server(["python_code"], env=env, workers=1, unsafe_no_sandbox=True) as url:
        obs, done, valid = one(url, "x", "<python>print('ran')</python>")
        assert valid and obs.strip() == "ran"


def test_sandbox_unavailable_raised_without_bwrap(monkeypatch, tmp_path):
    monkeypatch.setenv("VERLTOOL_BWRAP", "/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        bwrap_argv(str(tmp_path), limits=None)
    ok, why = sandbox_status(refresh=True)
    assert not ok and "bwrap" in why
    monkeypatch.delenv("VERLTOOL_BWRAP")
    assert sandbox_status(refresh=True)[0]


def test_unsafe_flag_logs_a_loud_warning():
    import subprocess as sp

    from tool_server.launcher import _REPO_ROOT, server_argv

    proc = sp.Popen(
        server_argv(["python_code"], workers=1, unsafe_no_sandbox=True),
        stdout=sp.PIPE,
        stderr=sp.PIPE,
        text=True,
        cwd=_REPO_ROOT,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("TOOL_SERVER_READY")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "WITHOUT a sandbox" in err and "!!!!" in err
