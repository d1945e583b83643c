"""Load and faults: many trajectories x turns sent concurrently to a real server with
the sandboxed python tool; every observation must belong to its own trajectory and
turn, and raising / hanging tools and killed sandbox workers must still yield
observations and leave the server healthy."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from support.tool_server import obs_text, write_faulty_tool

from tool_server.launcher import get_json, run_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tool_dir = write_faulty_tool(str(tmp_path_factory.mktemp("tools")))
    # The per-call timeout counts time queued for a sandboxed worker too: 200 first-turn
    # python calls arrive at once on 4 workers, so leave room for a loaded machine; the
    # hanging tool still shows the timeout path.
    with run_server(["python_code", "faulty"], tool_dir=[tool_dir], timeout=12, workers=4) as url:
        yield url


def plan(t: int, turn: int) -> tuple[str, str]:
    """(action, expected substring) for trajectory ``t`` at ``turn``."""
    tid = f"traj-{t}"
    if t % 50 == 7 and turn == 2:
        return (
            "<python>import os, signal; os.kill(os.getppid(), signal.SIGKILL)</python>",
            "killed",
        )
    if t % 40 == 3 and turn == 1:
        return "<raise/>", "boom from the tool"
    if t % 100 == 11 and turn == 3:
        return "<hang/>", "timed out"
    if turn % 2 == 0:
        return (f"<python>print('{tid}', {turn} * 1000 + {t})</python>", f"{tid} {turn * 1000 + t}")
    return f"<echo>{tid}:{turn}", f"{tid}|<echo>{tid}:{turn}"


async def trajectory(session, url, t, turns, log):
    tid = f"traj-{t}"
    for turn in range(turns):
        action, expect = plan(t, turn)
        async with session.post(
            url + "/get_observation", json={"trajectory_ids": [tid], "actions": [action]}
        ) as r:
            assert r.status == 200
            out = await r.json()
        log.append((t, turn, expect, obs_text(out["observations"][0]), out["dones"][0]))
    async with session.post(
        url + "/get_observation", json={"trajectory_ids": [tid], "actions": [""], "finish": [True]}
    ) as r:
        assert (await r.json())["dones"] == [True]


async def run_load(url, n, turns):
    log = []
    conn = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
        await asyncio.gather(*(trajectory(s, url, t, turns, log) for t in range(n)))
    return log


def check(url, n, turns):
    t0 = time.monotonic()
    log = asyncio.run(run_load(url, n, turns))
    elapsed = time.monotonic() - t0
    assert len(log) == n * turns  # nothing dropped
    seen = {(t, turn) for t, turn, *_ in log}
    assert len(seen) == n * turns
    for t, turn, expect, obs, done in log:
        assert expect in obs, (t, turn, expect, obs)  # no mix-ups
        assert not done
    h = get_json(url + "/health")
    assert h["status"] == "ok" and h["in_flight"] == 0
    assert h["live_trajectories"] == 0  # finish freed everything
    return elapsed


def test_200_trajectories_x_5_turns_concurrently(server):
    elapsed = check(server, 200, 5)
    print(f"200x5 in {elapsed:.1f} s")
    # the server still answers promptly afterwards
    t0 = time.monotonic()
    asyncio.run(run_load(server, 1, 1))
    assert time.monotonic() - t0 < 2


@pytest.mark.slow
def test_1000_trajectories_x_5_turns_concurrently(server):
    check(server, 1000, 5)
