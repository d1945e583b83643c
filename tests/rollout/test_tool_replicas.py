"""Tool-server replicas: ``tool_server.url`` lists several real servers; trajectories are
routed by a stable hash of their id, and a replica killed mid-run fails only the
trajectories that were on it, with a clear error, while the run goes on with the others."""

import asyncio
import signal

import psutil
import pytest
from support.scripted_sampler import ScriptedSampler

from tool_server.client import ToolClient, ToolServerError, parse_tool_urls, rendezvous_index
from tool_server.launcher import get_json, run_server
from verltool_jax.rollout.agent_loop import PromptItem, run_rollout
from verltool_jax.rollout.config import RolloutConfig

PROMPT = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"


def _server_pid(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    for p in psutil.Process().children(recursive=True):
        try:
            if any(
                c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                for c in p.net_connections(kind="inet")
            ):
                return p.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no child process listens on {url}")


@pytest.fixture
def replicas():
    with (
        run_server(tools=["python_code"], timeout=5.0) as a,
        run_server(tools=["python_code"], timeout=5.0) as b,
    ):
        yield [a, b]


def test_url_list_parsing_and_stable_routing():
    assert parse_tool_urls("http://a:1, http://b:2/") == ["http://a:1", "http://b:2"]
    for bad, msg in (("", "empty"), ("http://a:1,b:2", "http://"), ("http://a,http://a", "twice")):
        with pytest.raises(ValueError, match=msg):
            parse_tool_urls(bad)
    urls = ["http://h:1", "http://h:2", "http://h:3"]
    keys = [f"traj-{i}" for i in range(300)]
    homes = [rendezvous_index(k, urls, [True] * 3) for k in keys]
    assert homes == [rendezvous_index(k, list(urls), [True] * 3) for k in keys]  # stable
    assert min(homes.count(i) for i in range(3)) > 60
    # a replica out: only its keys move
    moved = [rendezvous_index(k, urls, [True, False, True]) for k in keys]
    assert all(m == h for m, h in zip(moved, homes) if h != 1) and 1 not in moved
    with pytest.raises(ToolServerError, match="every tool server replica is down"):
        rendezvous_index("x", urls, [False] * 3)


def test_replica_killed_mid_run_fails_only_its_trajectories(tok, replicas):
    joined = ",".join(replicas)
    victim = replicas[1]
    killed = []

    def script(rid, k):
        if k == 1 and not killed:  # mid-run: every trajectory has used its replica
            killed.append(_server_pid(victim))
            psutil.Process(killed[0]).send_signal(signal.SIGKILL)
        return {0: "<python>print(6*7)</python>", 1: "<python>print(1)</python>"}.get(
            k, "<answer>42</answer>"
        )

    cfg = RolloutConfig(max_turns=3, max_response_tokens=512)
    items = [
        PromptItem(tok.encode(PROMPT, add_special_tokens=False), group_id=f"p{i}") for i in range(4)
    ]

    async def go():
        async with ToolClient(joined, retries=1, backoff_s=0.01, revive_after_s=600) as c:
            groups = await run_rollout(items, 3, ScriptedSampler(tok, script), c, tok, cfg)
            live_after = c.live_replicas
            # the run goes on: new trajectories only reach the surviving replica
            after = await run_rollout(
                [PromptItem(items[0].prompt_ids, group_id="q")],
                6,
                ScriptedSampler(tok, lambda rid, k: script(rid, 2 * k)),
                c,
                tok,
                cfg,
            )
            return groups, live_after, after

    groups, live_after, after = asyncio.run(go())
    assert killed and live_after == [replicas[0]]
    trajs = [t for g in groups for t in g]
    home = {
        t.trajectory_id: rendezvous_index(t.trajectory_id, replicas, [True, True]) for t in trajs
    }
    assert set(home.values()) == {0, 1}  # both replicas were used
    for t in trajs:
        if home[t.trajectory_id] == 0:
            assert t.termination != "error", (t.trajectory_id, t.error)
            assert t.tool_calls == 2
        else:
            assert t.termination == "error"
            assert victim in t.error or "went down" in t.error, t.error
    assert all(t.termination != "error" for g in after for t in g)
    assert get_json(replicas[0] + "/health")["status"] == "ok"
