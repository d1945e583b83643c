"""Tool-server throughput: requests/s and p50/p99 latency, client included.

Starts a real server (``python -m tool_server --tools python_code``) and drives it from
an aiohttp client in this process (both on the same machine, so the figures include
the client's own CPU). Scenarios: ``<python>print(1+1)</python>`` at concurrency 1, 16
and 64; a CPU-heavy snippet at concurrency 16; an invalid action (pure server
overhead) at concurrency 1 and 64. Each scenario runs for ``--seconds`` after a warm-up.

Besides wall-clock figures it prints the CPU time per request of the server (with its
sandboxed workers and their children) and of the client, and ``CPU-bound`` = cores x
1000 / (server + client CPU ms per request): the rate the machine's cores could
sustain if nothing else ran on them (the wall figures depend on the machine's load,
printed in the header).

    python benchmarks/tool_server_throughput.py [--seconds 4] [--workers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import aiohttp
import psutil

from tool_server.launcher import run_server

SIMPLE = "<python>print(1+1)</python>"
CPU_HEAVY = "<python>print(sum(i * i for i in range(300000)))</python>"
INVALID = "just some text with no tool call"


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def scenario(
    url: str, action: str, concurrency: int, seconds: float, expect: str | None
) -> dict:
    lat: list[float] = []
    errors = 0
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def one(i: int) -> float:
            body = {"trajectory_ids": [f"b{i}"], "actions": [action]}
            t0 = time.perf_counter()
            async with session.post(url + "/get_observation", json=body) as r:
                out = await r.json()
            dt = time.perf_counter() - t0
            obs = out["observations"][0]
            text = obs if isinstance(obs, str) else obs.get("obs", "")
            if expect is not None and expect not in text:
                raise AssertionError(f"unexpected observation {obs!r}")
            return dt

        # warm-up
        await asyncio.gather(*(one(i) for i in range(concurrency * 2)))
        stop = time.perf_counter() + seconds

        async def loop(k: int) -> None:
            nonlocal errors
            i = 0
            while time.perf_counter() < stop:
                try:
                    lat.append(await one(k * 1_000_000 + i))
                except AssertionError:
                    errors += 1
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(loop(k) for k in range(concurrency)))
        wall = time.perf_counter() - t0
    return {
        "n": len(lat),
        "rps": len(lat) / wall,
        "p50_ms": 1000 * percentile(lat, 0.5),
        "p99_ms": 1000 * percentile(lat, 0.99),
        "errors": errors,
    }


def server_cpu_s(url: str) -> float:
    """CPU seconds used so far by the server process listening on ``url``'s port and by
    all its descendants (sandboxed workers and their reaped children)."""
    port = int(url.rsplit(":", 1)[1])
    for p in psutil.process_iter():
        try:
            if any(
                c.laddr and c.laddr.port == port and c.status == "LISTEN"
                for c in p.net_connections("tcp")
            ):
                total = 0.0
                for q in [p] + p.children(recursive=True):
                    t = q.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
                return total
        except psutil.Error:
            continue
    return float("nan")


def client_cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


async def main_async(url: str, seconds: float) -> list[tuple[str, int, dict]]:
    rows = []
    for name, action, conc, expect in [
        ("python print(1+1)", SIMPLE, 1, "2"),
        ("python print(1+1)", SIMPLE, 16, "2"),
        ("python print(1+1)", SIMPLE, 64, "2"),
        ("python CPU-heavy (sum of 300k squares)", CPU_HEAVY, 16, "8999955000050000"),
        ("invalid action", INVALID, 1, None),
        ("invalid action", INVALID, 64, None),
    ]:
        s0, c0 = server_cpu_s(url), client_cpu_s()
        r = await scenario(url, action, conc, seconds, expect)
        s1, c1 = server_cpu_s(url), client_cpu_s()
        n_all = r["n"] + 2 * conc  # the warm-up requests are inside the CPU window
        r["server_cpu_ms"] = 1000 * (s1 - s0) / n_all
        r["client_cpu_ms"] = 1000 * (c1 - c0) / n_all
        rows.append((name, conc, r))
        # what the CPUs could do if nothing else ran: cores / CPU time per request
        r["cpu_bound_rps"] = (
            os.cpu_count() * 1000 / max(1e-9, r["server_cpu_ms"] + r["client_cpu_ms"])
        )
        print(
            f"{name:38s} c={conc:<3d} {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.2f} ms  "
            f"p99 {r['p99_ms']:7.2f} ms  CPU/req server {r['server_cpu_ms']:5.2f} ms "
            f"client {r['client_cpu_ms']:5.2f} ms  CPU-bound {r['cpu_bound_rps']:6.0f} req/s "
            f"(n={r['n']}, errors={r['errors']})",
            flush=True,
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=4.0, help="measured time per scenario")
    ap.add_argument("--workers", type=int, default=4, help="sandboxed python workers")
    args = ap.parse_args()
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    print(
        f"# tool server throughput: {os.cpu_count()} CPUs, {platform.machine()}, "
        f"python {platform.python_version()}, client loop {loop_name}, "
        f"{args.workers} sandboxed workers, {args.seconds:g} s per scenario, "
        f"load average before start {os.getloadavg()[0]:.1f}"
    )
    with run_server(["python_code"], workers=args.workers, timeout=30, max_concurrency=512) as url:
        asyncio.run(main_async(url, args.seconds))


if __name__ == "__main__":
    main()
