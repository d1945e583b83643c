"""Soak: adversarial calls interleaved with normal ones against one real server. Afterwards
the server is healthy, the memory of its process tree is back near where it started, no
process or file of the calls is left on the host, and a normal call answers at its usual
latency. The default run makes 120 calls; the slow one makes 1000."""

from __future__ import annotations

import json
import os
import random
import socket
import sqlite3
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from support.tool_server import obs_text
from support.workspace_tools import call, finish, tool_call

from tool_server.launcher import get_json, post_json, run_server

OPTS = {
    "python_memory_mb": 256,
    "python_disk_mb": 32,
    "python_nproc": 32,
    "python_timeout": 1,
    "python_cpu_s": 1,
    "bash_timeout_s": 2,
}

FORGE = (
    "import os, struct, json\nh = json.dumps({'stdout_len': 4 << 30}).encode()\n"
    "for fd in map(int, os.listdir('/proc/self/fd')):\n"
    "    try: os.write(fd, struct.pack('>I', len(h)) + h)\n"
    "    except OSError: pass\n"
)
ADVERSARIAL_PYTHON = [
    # memory spread over processes, scratch space, leftovers, IPC, escapes
    "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        b = bytearray(150 << 20)\n"
    "        for i in range(0, len(b), 4096): b[i] = 1\n        time.sleep(9)\n        os._exit(0)\n"
    "time.sleep(9)",
    "f = open('/tmp/fill', 'wb')\nwhile True: f.write(b'0' * (1 << 20))",
    "open('/workspace/leak', 'w').write('x' * 1000); open('/var/tmp/leak', 'w').write('y')",
    "import ctypes; ctypes.CDLL(None).shmget(0x5EC, 1 << 20, 0o1666)",
    "import subprocess; subprocess.Popen(['sleep', '300']); print('bg')",
    "while True: print('spam' * 1000)",
    "while True: pass",
    "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
    "import os, signal; os.kill(os.getppid(), signal.SIGKILL)",
    "x = ' ' * (300 << 20)",
]


def _tree(url: str) -> list[psutil.Process]:
    port = int(url.rsplit(":", 1)[1])
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            p = psutil.Process(c.pid)
            return [p] + p.children(recursive=True)
    raise AssertionError("server process not found")


def tree_rss(url: str) -> int:
    total = 0
    for p in _tree(url):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def files_under(root: str) -> set[str]:
    out = set()
    for dirpath, dirs, files in os.walk(root):
        out.update(os.path.relpath(os.path.join(dirpath, x), root) for x in dirs + files)
    return out


def normal_latency(url: str, n: int = 10) -> float:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        status, body = post_json(
            url + "/get_observation",
            {"trajectory_ids": [f"lat{i}"], "actions": ["<python>print(6 * 7)</python>"]},
        )
        times.append(time.perf_counter() - t0)
        assert status == 200 and body["observations"][0].strip() == "42", body
    return statistics.median(times)


def _socket_abandon(url: str) -> None:
    host, port = url.split("//")[1].split(":")
    body = json.dumps(
        {
            "trajectory_ids": [f"ab{i}" for i in range(20)],
            "actions": ["<python>import time; time.sleep(0.5)</python>"] * 20,
        }
    ).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(
        f"POST /get_observation HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    time.sleep(0.05)
    s.close()


def soak(url: str, db: str, n_calls: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    counts = {"normal": 0, "adversarial": 0}

    def normal(i: int) -> None:
        kind = i % 3
        if kind == 0:
            status, body = post_json(
                url + "/get_observation",
                {"trajectory_ids": [f"n{i}"], "actions": [f"<python>print({i} + 1)</python>"]},
            )
            assert status == 200 and obs_text(body["observations"][0]).strip() == str(i + 1), body
        elif kind == 1:
            obs, valid = call(url, f"n{i}", "<sql>SELECT count(*) FROM t</sql>", {"db_path": db})
            assert valid and "20" in obs["obs"], obs
        else:
            obs, valid = call(url, f"n{i}", "<bash>echo hello $((6*7))</bash>")
            assert valid and "hello 42" in obs["obs"], obs
            finish(url, f"n{i}")

    def adversarial(i: int) -> None:
        kind = rng.randrange(9)
        tid = f"a{i}"
        if kind <= 2:
            code = ADVERSARIAL_PYTHON[i % len(ADVERSARIAL_PYTHON)]
            status, body = post_json(
                url + "/get_observation",
                {"trajectory_ids": [tid], "actions": [f"<python>{code}</python>"]},
            )
            assert status == 200, body
        elif kind == 3:
            ef = {"stateful": True}
            call(url, tid, "<python>x = 1</python>", ef)
            call(url, tid, f"<python>{FORGE}</python>", ef)
            finish(url, tid)
        elif kind == 4:
            bomb = rng.choice(["<tool_call>", "<python>", "```python\n", "<sql>"]) * 8000
            status, body = post_json(
                url + "/get_observation", {"trajectory_ids": [tid], "actions": [bomb]}
            )
            assert status == 200, body
        elif kind == 5:
            obs, _ = call(url, tid, "<sql>SELECT zeroblob(400000000)</sql>", {"db_path": db})
            assert "too big" in obs["obs"], obs
        elif kind == 6:
            call(url, tid, "<bash>mkfifo p; head -c 50000000 /dev/zero | tr '\\0' x > big</bash>")
            obs, valid = call(url, tid, tool_call("file_editor", command="view", path="p"))
            assert not valid and "regular file" in obs["obs"], obs
            obs, valid = call(
                url, tid, tool_call("file_editor", command="view", path="big", view_range=[1, 1])
            )
            finish(url, tid)
        elif kind == 7:
            raw = rng.choice([b"[" * 100_000, b"{" * 50_000, b"\xff\xfe"])
            status, _ = post_json(url + "/get_observation", raw)
            assert status == 400
            status, _ = post_json(
                url + "/get_observation", {"trajectory_ids": ["x"] * 100, "actions": ["x"] * 100}
            )
            assert status == 422
            status, _ = post_json(
                url + "/get_observation", {"trajectory_ids": ["x"], "actions": ["x" * (3 << 20)]}
            )
            assert status == 413
        else:
            _socket_abandon(url)

    def one(i: int) -> None:
        if rng.random() < 0.5:
            counts["normal"] += 1
            normal(i)
        else:
            counts["adversarial"] += 1
            adversarial(i)

    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(one, i) for i in range(n_calls)]:
            f.result()
    return counts


def run_soak(tmp_path, n_calls: int) -> None:
    db = str(tmp_path / "t.db")
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (x)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(20)])
    con.commit()
    con.close()
    workdir = str(tmp_path / "wd")
    os.makedirs(workdir)
    with run_server(
        ["python_code", "sql", "bash", "file_editor"],
        timeout=10,
        workers=2,
        workdir=workdir,
        tool_opt=OPTS,
        max_request_mb=2,
        max_batch=64,
        client_timeout=5,
    ) as url:
        normal_latency(url, 5)  # warm up
        rss0, procs0, files0 = tree_rss(url), len(_tree(url)), files_under(workdir)
        lat0 = normal_latency(url)

        def new_files() -> set[str]:
            return files_under(workdir) - files0 - {"trash", "workspaces"}

        t0 = time.monotonic()
        counts = soak(url, db, n_calls)
        elapsed = time.monotonic() - t0
        deadline = time.monotonic() + 20  # workers killed by the calls restart
        while time.monotonic() < deadline:
            h = get_json(url + "/health")
            if (
                h["in_flight"] == 0
                and h["live_trajectories"] == 0
                and len(_tree(url)) == procs0
                and not new_files()
            ):
                break
            time.sleep(0.2)
        health = get_json(url + "/health")
        assert health["status"] == "ok" and health["in_flight"] == 0, health
        assert len(_tree(url)) == procs0, [p.cmdline()[:3] for p in _tree(url)]
        lat1 = normal_latency(url)
        rss1 = tree_rss(url)
        print(
            f"\nsoak: {n_calls} calls ({counts}) in {elapsed:.1f} s; tree RSS "
            f"{rss0 >> 20} -> {rss1 >> 20} MB; {procs0} processes; normal call p50 "
            f"{lat0 * 1000:.1f} -> {lat1 * 1000:.1f} ms"
        )
        assert rss1 < rss0 * 1.25 + (48 << 20), (rss0, rss1)
        assert lat1 < 2 * lat0 + 0.03, (lat0, lat1)
        assert not new_files(), sorted(new_files())[:20]


def test_soak_small(tmp_path):
    run_soak(tmp_path, 120)


@pytest.mark.slow
def test_soak_thousand_calls(tmp_path):
    run_soak(tmp_path, 1000)
