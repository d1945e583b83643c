"""The tool server under attack, for real (a running server, the real sandbox): what one
trajectory's code can see of another's, resource budgets that cover every process of a
call, byte caps on what tools read and hold, and a server that cannot be wedged by FIFOs,
parser bombs, huge or slow or abandoned requests. After every attack the server answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from support.tool_server import obs_text, one
from support.workspace_tools import call, finish, tool_call

from tool_server.kit.tags import last_tag_body
from tool_server.kit.tool_calls import parse_tool_call_for
from tool_server.launcher import get_json, post_json, run_server
from tool_server.python_pool import SandboxProcess, WorkerDied
from tool_server.sandbox import ProcessHandle, ResourceLimits, uid_block
from tool_server.tools.python_code import extract_code

LIMITS = {
    "python_memory_mb": 256,
    "python_disk_mb": 32,
    "python_nproc": 32,
    "python_cpu_s": 2,
    "bash_total_memory_mb": 256,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One python worker, so consecutive calls of different trajectories share it."""
    workdir = str(tmp_path_factory.mktemp("wd"))
    with run_server(
        ["python_code", "sql", "bash", "file_editor"],
        timeout=4,
        workers=1,
        workdir=workdir,
        tool_opt=LIMITS,
        max_request_mb=1,
        max_batch=64,
        client_timeout=1.5,
    ) as url:
        yield url, workdir


def py(url: str, code: str, tid: str = "h", **kw) -> str:
    obs, done, valid = one(url, tid, f"<python>{code}</python>", **kw)
    assert valid and not done
    return obs_text(obs)


def server_tree_rss(url: str) -> int:
    """RSS in bytes of the server process (the one listening on ``url``'s port) and all
    its descendants (workers, sandboxes)."""
    port = int(url.rsplit(":", 1)[1])
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            p = psutil.Process(c.pid)
            total = 0
            for q in [p] + p.children(recursive=True):
                try:
                    total += q.memory_info().rss
                except psutil.Error:
                    pass
            return total
    raise AssertionError("server process not found")


def server_rss(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            return psutil.Process(c.pid).memory_info().rss
    raise AssertionError("server process not found")


# --- isolation between trajectories ----------------------------------------------------------
def test_files_in_every_writable_place_are_gone_for_the_next_call(server):
    url, _ = server
    out = py(
        url,
        """
import os
for d in ('/workspace', '/var/tmp', '/tmp', '.'):
    open(os.path.join(d, 'left_behind.txt'), 'w').write('secret of trajectory A')
os.makedirs('/workspace/sub/dir', exist_ok=True); open('/workspace/sub/dir/f', 'w').write('x')
os.chmod('/workspace/sub', 0o500)     # a directory the call made unwritable
print('written')
""",
        tid="A",
    )
    assert out.strip() == "written"
    out = py(
        url,
        """
import os
print(sorted(os.listdir('/workspace')), os.listdir('/tmp'), os.listdir('/var/tmp'))
""",
        tid="B",
    )
    assert "left_behind" not in out and "sub" not in out, out


def test_sysv_shared_memory_does_not_outlive_the_call(server):
    url, _ = server
    out = py(
        url,
        """
import ctypes
libc = ctypes.CDLL(None)
shmid = libc.shmget(0x5EC2E7, 4096, 0o1666)     # IPC_CREAT | 0666
print('created' if shmid >= 0 else 'failed')
""",
        tid="A",
    )
    assert "created" in out
    out = py(url, "print(open('/proc/sysvipc/shm').read().count('\\n') - 1)", tid="B")
    assert out.strip() == "0", out


def test_no_earlier_call_data_in_the_memory_a_call_inherits(server):
    url, _ = server
    head, tail = "TRAJ_A_SECRET_", uuid.uuid4().hex
    py(url, f"s = {head + tail!r}\nprint(s * 50)", tid="A")
    # search this process's whole writable memory for head+tail, without ever building
    # head+tail here: find head, then compare what follows with tail
    out = py(
        url,
        f"""
import ctypes
head, tail = {head!r}.encode(), {tail!r}.encode()
found = 0
with open('/proc/self/maps') as maps:
    regions = [line.split() for line in maps]
for fields in regions:
    addr, perms = fields[:2]
    if not perms.startswith('rw'):
        continue
    lo, hi = (int(x, 16) for x in addr.split('-'))
    data = ctypes.string_at(lo, hi - lo)
    if True:
        i = data.find(head)
        while i >= 0:
            found += data[i + len(head):i + len(head) + len(tail)] == tail
            i = data.find(head, i + 1)
print('found', found)
""",
        tid="B",
    )
    assert out.strip() == "found 0", out


def test_proc_1_cmdline_shows_no_host_path_or_worker_source(server):
    url, workdir = server
    out = py(
        url,
        """
import os
for pid in sorted(p for p in os.listdir('/proc') if p.isdigit()):
    try:
        print(pid, open(f'/proc/{pid}/cmdline').read().replace('\\0', ' '))
    except OSError:
        pass
""",
    )
    assert out.startswith("1 "), out
    venv = os.path.realpath(sys.prefix)
    for leak in (workdir, venv, sys.prefix, "PRELUDE", "def main", "--ro-bind", "/work/"):
        assert leak not in out, (leak, out)


def test_bash_sandbox_proc_1_cmdline_shows_no_host_path(server):
    url, workdir = server
    obs, valid = call(url, "C", "<bash>tr '\\0' ' ' < /proc/1/cmdline; echo; pwd</bash>")
    assert valid and "bwrap --args" in obs["obs"], obs
    for leak in (workdir, os.path.realpath(sys.prefix), "--ro-bind", "/work/"):
        assert leak not in obs["obs"], (leak, obs)
    finish(url, "C")


def test_uid_blocks_are_unique_per_server_process(tmp_path):
    env = dict(os.environ, VERLTOOL_UID_LOCK_DIR=str(tmp_path / "locks"))
    code = (
        "import sys, time; from tool_server.sandbox import uid_block; "
        "print(uid_block(), flush=True); sys.stdin.read()"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    try:
        blocks = [int(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.communicate("")
    assert len(set(blocks)) == 3, blocks
    assert all(b >= 200_000 and (b - 200_000) % 4096 == 0 for b in blocks)
    # a block is free again once its holder exited
    again = subprocess.run(
        [sys.executable, "-c", code], input="", capture_output=True, text=True, env=env, check=True
    )
    assert int(again.stdout) >= 200_000
    assert uid_block() == uid_block()  # stable within one process


def test_sandbox_uid_comes_from_this_servers_block(server):
    url, _ = server
    uid = int(py(url, "import os; print(os.getuid())").strip())
    if os.geteuid() == 0:
        assert uid >= 200_000 and uid != 0


# --- resource budgets ----------------------------------------------------------------------------
def test_memory_budget_covers_all_processes_of_a_call(server):
    url, _ = server
    t0 = time.monotonic()
    out = py(
        url,
        """
import os, time
for _ in range(3):
    if os.fork() == 0:
        block = bytearray(150 * 1024 * 1024)     # under the per-process limit (256 MB)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(30)
        os._exit(0)
time.sleep(30)
""",
    )
    assert "used more than 256 MB together" in out, out
    assert time.monotonic() - t0 < 4
    assert py(url, "print('ok')").strip() == "ok"


def test_memory_budget_covers_a_stateful_interpreter_and_its_children(server):
    url, _ = server
    ef = {"stateful": True}
    py(url, "keep = 1", tid="KM", extra_fields=ef)
    out = py(
        url,
        """
import os, time
for _ in range(2):
    if os.fork() == 0:
        b = bytearray(150 << 20)
        for i in range(0, len(b), 4096): b[i] = 1
        time.sleep(30)
time.sleep(30)
""",
        tid="KM",
        extra_fields=ef,
    )
    assert "used more than 256 MB together" in out and "variables are lost" in out, out
    assert "NameError" in py(url, "print(keep)", tid="KM", extra_fields=ef)
    finish(url, "KM")


def test_memory_budget_covers_all_processes_of_a_shell(server):
    url, _ = server
    hog = (
        'python3 -c "import time; b = bytearray(150 << 20); '
        '[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; time.sleep(30)" &'
    )
    t0 = time.monotonic()
    obs, valid = call(url, "M", f"<bash>{hog} {hog} {hog} sleep 30</bash>")
    assert valid and "used more than 256 MB together" in obs["obs"], obs
    assert time.monotonic() - t0 < 3.6
    obs, valid = call(url, "M", "<bash>echo back</bash>")
    assert valid and "back" in obs["obs"], obs
    finish(url, "M")


@pytest.mark.parametrize("where", ["/tmp", "/var/tmp", "/workspace"])
def test_scratch_space_is_bounded(server, where):
    url, _ = server
    out = py(
        url,
        f"""
import errno
try:
    with open('{where}/fill', 'wb') as f:
        for _ in range(64):
            f.write(b'0' * (1 << 20))       # 64 MB into a 32 MB tmpfs
    print('wrote everything')
except OSError as e:
    print('stopped', errno.errorcode[e.errno])
""",
    )
    assert "stopped ENOSPC" in out, out


def test_stateful_code_cannot_reach_the_protocol_pipe(server):
    url, _ = server
    ef = {"stateful": True}
    rss0 = server_rss(url)
    py(url, "x = 7", tid="K", extra_fields=ef)
    # forge a reply announcing 4 GB on every pipe this process holds
    out = py(
        url,
        """
import os, struct, json
hdr = json.dumps({"stdout_len": 4 << 30, "stderr_len": 0}).encode()
for fd in map(int, os.listdir('/proc/self/fd')):
    try:
        os.write(fd, struct.pack('>I', len(hdr)) + hdr + b'A' * 65536)
    except OSError:
        pass
print('x is', x)
""",
        tid="K",
        extra_fields=ef,
    )
    assert server_rss(url) - rss0 < 50 << 20
    # whatever happened to the interpreter, the server answers, and a trajectory keeps
    # a working interpreter
    out = py(url, "print('alive', 1 + 1)", tid="K", extra_fields=ef)
    assert "alive 2" in out, out
    finish(url, "K")


def test_a_forged_worker_reply_is_refused_without_allocating(tmp_path):
    """A worker (or what runs in its place) announcing a 4 GB output is killed."""
    forged = (
        "import json, struct, sys; out = sys.stdout.buffer; "
        "h = json.dumps({'ready': True}).encode(); out.write(struct.pack('>I', len(h)) + h); "
        "out.flush(); sys.stdin.buffer.read(4); "
        "h = json.dumps({'stdout_len': 4 << 30, 'stderr_len': 0}).encode(); "
        "out.write(struct.pack('>I', len(h)) + h); out.flush(); import time; time.sleep(30)"
    )

    async def go():
        w = SandboxProcess("fork", str(tmp_path), unsafe=True)
        w.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            forged,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        w.handle = ProcessHandle(w.proc.pid)
        assert (await w._read_header())["ready"]
        with pytest.raises(WorkerDied, match="protocol violation"):
            await w.call("print(1)", ResourceLimits(wall_s=5), 1 << 16)
        assert not w.alive
        w.kill()
        await w.proc.wait()

    asyncio.run(go())


def test_sql_caps_bytes_not_only_rows(server, tmp_path):
    url, _ = server
    db = tmp_path / "t.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (s TEXT)")
    con.executemany("INSERT INTO t VALUES (?)", [("y" * 300_000,)] * 20)
    con.commit()
    con.close()
    rss0 = server_rss(url)
    obs, _, valid = one(
        url, "s", "<sql>SELECT zeroblob(400000000)</sql>", extra_fields={"db_path": str(db)}
    )
    assert "too big" in obs_text(obs), obs
    assert server_rss(url) - rss0 < 100 << 20
    obs, _, _ = one(url, "s", "<sql>SELECT s FROM t</sql>", extra_fields={"db_path": str(db)})
    assert "only the first 3 rows" in obs_text(obs), obs_text(obs)[-200:]


def _write_fifo_and_big_file(url: str, tid: str) -> None:
    obs, valid = call(
        url,
        tid,
        '<bash>mkfifo pipe && python3 -c "import sys\n'
        "with open('big.txt','w') as f:\n"
        "    [f.write('x' * 1000 + '\\\\n') for _ in range(60000)]\n"
        "    f.write('the last line\\\\n')\" && ls -la pipe big.txt</bash>",
    )
    assert valid and "pipe" in obs["obs"] and "big.txt" in obs["obs"], obs


def test_file_editor_never_blocks_on_a_fifo_nor_reads_a_huge_file_whole(server):
    url, _ = server
    _write_fifo_and_big_file(url, "F")
    t0 = time.monotonic()
    for _ in range(10):  # more than the server's thread pool could lose
        obs, valid = call(url, "F", tool_call("file_editor", command="view", path="pipe"))
        assert not valid and "not a regular file" in obs["obs"], obs
    assert time.monotonic() - t0 < 3
    rss0 = server_rss(url)
    obs, valid = call(
        url,
        "F",
        tool_call("file_editor", command="view", path="big.txt", view_range=[60001, 60001]),
    )
    assert valid and "60001\tthe last line" in obs["obs"], obs
    obs, valid = call(
        url,
        "F",
        tool_call(
            "file_editor",
            command="str_replace",
            path="big.txt",
            old_str="the last line",
            new_str="z",
        ),
    )
    assert not valid and "limit" in obs["obs"], obs
    assert server_rss(url) - rss0 < 30 << 20  # the 60 MB file was never read whole
    finish(url, "F")


def test_image_tool_caps_what_a_trajectory_holds(tmp_path):
    from PIL import Image

    path = tmp_path / "big.png"
    Image.new("RGB", (2048, 2048), (10, 20, 30)).save(path)
    with run_server(["image"], timeout=20, tool_opt={"image_max_trajectory_mb": 64}) as url:
        ef = {"images": [str(path)]}
        results = [call(url, "I", tool_call("rotate", angle=90), ef) for _ in range(8)]
        ok = [r for r in results if r[1]]
        refused = [r for r in results if not r[1]]
        # 16 MB per 2048x2048 image: the source and three rotations fill 64 MB, no more
        assert len(ok) == 3 and "limit per trajectory" in refused[0][0]["obs"], results[-1]
        finish(url, "I")
        fifo = tmp_path / "fifo.png"
        os.mkfifo(fifo)
        for ref in (str(fifo), "/dev/zero"):  # never opened for a blocking read
            obs, valid = call(url, "J", tool_call("rotate", angle=90), {"images": [ref]})
            assert not valid and "not a regular file" in obs["obs"], obs
            finish(url, "J")


# --- availability --------------------------------------------------------------------------------
def test_parser_bombs_are_fast_and_do_not_stall_the_server(server):
    url, _ = server
    bombs = [
        "<tool_call>" * 10_000,
        "<python>" * 12_000,
        "```python\n" * 10_000,
        "<sql>" * 20_000,
        "<bash>" * 15_000,
    ]
    for bomb in bombs:  # the parsers alone: linear
        t0 = time.perf_counter()
        parse_tool_call_for(bomb, {"file_editor"})
        extract_code(bomb)
        last_tag_body(bomb, "sql")
        assert time.perf_counter() - t0 < 0.2
    t0 = time.monotonic()
    status, body = post_json(
        url + "/get_observation", {"trajectory_ids": [f"b{i}" for i in range(5)], "actions": bombs}
    )
    assert status == 200 and len(body["observations"]) == 5, body
    assert time.monotonic() - t0 < 2


def _raw_request(url: str, body: bytes, headers: str = "") -> socket.socket:
    host, port = url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(
        (
            f"POST /get_observation HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
        ).encode()
        + body
    )
    return s


def test_a_disconnected_client_cancels_its_work(server):
    url, _ = server
    n = 60
    body = json.dumps(
        {
            "trajectory_ids": [f"d{i}" for i in range(n)],
            "actions": ["<python>import time; time.sleep(1)</python>"] * n,
        }
    ).encode()
    s = _raw_request(url, body)
    time.sleep(0.5)
    assert get_json(url + "/health")["in_flight"] >= 1
    s.close()  # 60 one-second calls on one worker: a minute of work
    deadline = time.monotonic() + 5
    while get_json(url + "/health")["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert get_json(url + "/health")["in_flight"] == 0
    t0 = time.monotonic()
    assert py(url, "print('next')").strip() == "next"
    assert time.monotonic() - t0 < 3


def test_request_size_and_batch_limits_get_413_and_422(server):
    url, _ = server
    status, body = post_json(
        url + "/get_observation", {"trajectory_ids": ["a"], "actions": ["x" * (2 << 20)]}
    )
    assert status == 413 and "--max-request-mb" in body["error"], body
    status, body = post_json(
        url + "/get_observation",
        {"trajectory_ids": [str(i) for i in range(65)], "actions": ["x"] * 65},
    )
    assert status == 422 and body["field"] == "trajectory_ids" and "64" in body["error"], body


def test_deeply_nested_json_is_a_400(server):
    url, _ = server
    for raw in (b"[" * 200_000, b'{"trajectory_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        status, body = post_json(url + "/get_observation", raw)
        assert status == 400 and "nested" in body["error"], (status, body)
    assert get_json(url + "/health")["status"] == "ok"


def test_slow_clients_are_cut_off(server):
    url, _ = server
    body = b'{"trajectory_ids": ["slow"], "actions": ["<python>print(1)</python>"]}'
    host, port = url.split("//")[1].split(":")
    # the body never completes: a 408 after --client-timeout (1.5 s)
    s = socket.create_connection((host, int(port)))
    s.sendall(
        (
            f"POST /get_observation HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body[:10]
    )
    s.settimeout(10)
    t0 = time.monotonic()
    reply = s.recv(4096)
    assert b" 408 " in reply.split(b"\r\n")[0], reply
    assert 1.0 < time.monotonic() - t0 < 6
    s.close()
    # the headers never complete: the connection is closed
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /get_observation HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    s.settimeout(10)
    t0 = time.monotonic()
    try:
        s.recv(4096)  # b"" (closed) or an error response, not a hang
    except TimeoutError:
        pytest.fail("a client stuck in its headers was never cut off")
    assert time.monotonic() - t0 < 6
    s.close()
    assert get_json(url + "/health")["status"] == "ok"
