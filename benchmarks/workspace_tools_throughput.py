"""Throughput and latency of the image, file_editor, bash, run_tests and mcp tools through
the real tool server.

A tool server (``tool_server.launcher.run_server``) runs all four tools; ``--clients``
concurrent clients send ``--requests`` requests in total, one action per request. Printed
per row: requests/s, p50 and p99 latency (ms) and the number of non-valid answers. Rows:

* ``image crop_image|zoom_in|rotate``: a new trajectory per request on a 512x512 PNG
  (``is_last_step``, so the state is freed right away);
* ``file_editor view|str_replace`` and ``bash echo``: steady state, each client keeps one
  trajectory (workspace and shell already made);
* ``bash first command``: a new trajectory per request: workspace copy of the
  ``--files``-file repository + sandboxed shell start + one command + cleanup;
* ``run_tests (pytest, 2 tests)``: steady state, a fresh sandboxed pytest each time;
* ``mcp add``: the ``mcp`` tool calling ``add`` on ``tests/mcp_test_server.py`` (stdio).

Then the cost of one workspace copy as the tools make it (working tree copied with
``cp -a --reflink=auto``, git objects hardlinked when the server is root), next to a full
copy and an all-hardlink copy (``cp -al``, not used: unsafe, see ``tool_server/kit/workspace.py``).
``--workdir /dev/shm`` puts the workspaces on a tmpfs.

Run: ``python benchmarks/workspace_tools_throughput.py [--requests 200 --clients 8]
[--workdir /dev/shm]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import aiohttp
import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from search_tools_throughput import percentile  # noqa: E402

from tool_server.kit.workspace import copy_tree  # noqa: E402
from tool_server.launcher import run_server  # noqa: E402

CALC = "def add(a, b):\n    return a + b\n"
TESTS = (
    "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
    "def test_zero():\n    assert add(0, 5) == 5\n"
)


def make_repo(path: str, files: int) -> str:
    """A repository with calc.py, its tests and ``files`` filler modules of ~2 KB."""
    os.makedirs(os.path.join(path, "pkg"))
    with open(os.path.join(path, "calc.py"), "w") as f:
        f.write(CALC)
    with open(os.path.join(path, "test_calc.py"), "w") as f:
        f.write(TESTS)
    for i in range(files):
        with open(os.path.join(path, "pkg", f"m{i}.py"), "w") as f:
            f.write("".join(f"x_{j} = {i * j}  # filler line\n" for j in range(80)))
    git = ["git", "-c", "user.email=b@b", "-c", "user.name=b", "-C", path]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "bench"], check=True)
    return path


def tool_call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


Body = Callable[[int, int], dict]  # (request index, client index) -> request body


async def load(url: str, body: Body, n: int, clients: int) -> tuple[float, list[float], int]:
    """``n`` requests from ``clients`` concurrent clients -> (seconds, latencies, invalid)."""
    lat: list[float] = []
    invalid = 0
    it = iter(range(n))

    async def client(c: int, session: aiohttp.ClientSession) -> None:
        nonlocal invalid
        for i in it:
            t0 = time.perf_counter()
            async with session.post(url + "/get_observation", json=body(i, c)) as r:
                out = await r.json()
            lat.append(time.perf_counter() - t0)
            invalid += not out["valids"][0]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as s:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, s) for c in range(clients)))
        return time.perf_counter() - t0, lat, invalid


def row(name: str, url: str, body: Body, n: int, clients: int) -> None:
    asyncio.run(load(url, body, min(n, 2 * clients), clients))  # warm-up (and state set-up)
    secs, lat, invalid = asyncio.run(load(url, body, n, clients))
    ms = [x * 1000 for x in lat]
    print(
        f"{name:<30} {n / secs:>9.1f} {statistics.median(ms):>9.1f} "
        f"{percentile(ms, 99):>9.1f} {invalid:>8d}",
        flush=True,
    )


def one(tid: str, action: str, extra: dict, last: bool = False) -> dict:
    return {
        "trajectory_ids": [tid],
        "actions": [action],
        "extra_fields": [extra],
        "is_last_step": [last],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--files", type=int, default=200, help="filler files in the repository")
    ap.add_argument(
        "--workdir",
        default=None,
        help="where workspaces are made (default: a temp dir; try /dev/shm)",
    )
    args = ap.parse_args()
    n, k = args.requests, args.clients

    tmp = tempfile.mkdtemp(prefix="bench_ws_")
    workdir = tempfile.mkdtemp(prefix="bench_ws_wd_", dir=args.workdir)
    repo = make_repo(os.path.join(tmp, "repo"), args.files)
    img = os.path.join(tmp, "img.png")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)).save(img)
    size_kb = (
        sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(repo) for f in fs) // 1024
    )
    print(
        f"# {n} requests, {k} concurrent clients; repository {args.files + 2} files + .git "
        f"({size_kb} KiB); workspaces in {workdir}; cpu count {os.cpu_count()}"
    )
    print(f"{'tool / action':<30} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'invalid':>8}")
    ex = {"repo_path": repo, "test_cmd": "python -m pytest -q -p no:cacheprovider test_calc.py"}
    with run_server(
        tools=["image", "file_editor", "bash", "run_tests"],
        timeout=60,
        workdir=workdir,
        max_concurrency=256,
    ) as url:
        images = {"images": [img]}
        row(
            "image crop_image",
            url,
            lambda i, c: one(
                f"img{i}-{time.monotonic_ns()}",
                tool_call("crop_image", bbox=[64, 64, 320, 320]),
                images,
                True,
            ),
            n,
            k,
        )
        row(
            "image zoom_in x2",
            url,
            lambda i, c: one(
                f"zoom{i}-{time.monotonic_ns()}",
                tool_call("zoom_in", bbox=[0, 0, 0.5, 0.5]),
                images,
                True,
            ),
            n,
            k,
        )
        row(
            "image rotate 30",
            url,
            lambda i, c: one(
                f"rot{i}-{time.monotonic_ns()}", tool_call("rotate", angle=30), images, True
            ),
            n,
            k,
        )
        row(
            "file_editor view",
            url,
            lambda i, c: one(
                f"fe{c}", tool_call("file_editor", command="view", path="calc.py"), ex
            ),
            n,
            k,
        )
        row(
            "file_editor str_replace",
            url,
            lambda i, c: one(
                f"fe{c}",
                tool_call(
                    "file_editor",
                    command="str_replace",
                    path="calc.py",
                    old_str="return",
                    new_str="return",
                ),
                ex,
            ),
            n,
            k,
        )
        row(
            "bash echo (warm shell)",
            url,
            lambda i, c: one(f"sh{c}", f"<bash>echo {i}</bash>", ex),
            n,
            k,
        )
        row(
            "bash first command (cold)",
            url,
            lambda i, c: one(f"cold{i}-{time.monotonic_ns()}", "<bash>ls | wc -l</bash>", ex, True),
            max(k, n // 4),
            k,
        )
        row(
            "run_tests (pytest, 2 tests)",
            url,
            lambda i, c: one(f"rt{c}", tool_call("run_tests"), ex),
            max(k, n // 8),
            k,
        )

    mcp_server = os.path.join(ROOT, "tests", "mcp_test_server.py")
    with run_server(
        tools=["mcp"],
        timeout=60,
        workdir=workdir,
        startup_timeout=120,
        tool_opt={"mcp_command": f"python {mcp_server}"},
    ) as url:
        row(
            "mcp add (stdio server)",
            url,
            lambda i, c: one(f"mcp{c}", tool_call("add", a=i, b=1), {}),
            n,
            k,
        )

    def timed(fn, reps: int = 5) -> float:
        out = []
        for r in range(reps):
            dst = os.path.join(workdir, f"copy{r}")
            t0 = time.perf_counter()
            fn(dst)
            out.append((time.perf_counter() - t0) * 1000)
            shutil.rmtree(dst)
        return statistics.median(out)

    def hardlink_all(dst: str) -> None:
        subprocess.run(["cp", "-al", repo, dst], check=True, stderr=subprocess.DEVNULL)

    uid = 4242 if os.geteuid() == 0 else None
    same_fs = os.stat(repo).st_dev == os.stat(workdir).st_dev
    print(
        f"# one workspace copy, median of 5 (ms): as the tools do (git objects linked: "
        f"{uid is not None and same_fs}) "
        f"{timed(lambda d: copy_tree(repo, d, link_git_objects_for_uid=uid)):.1f}; "
        f"full cp -a --reflink=auto {timed(lambda d: copy_tree(repo, d)):.1f}; "
        f"cp -al (all hardlinks, unsafe, not used) "
        + (f"{timed(hardlink_all):.1f}" if same_fs else "n/a (other file system)")
    )
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
