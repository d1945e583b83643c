"""ToolClient against a real aiohttp server speaking the VerlTool protocol.

The server here is a tiny controllable one (it can fail, stall or answer 5xx on demand),
because those failure modes are what the client's retry/timeout logic is about. The
agent-loop tests use the project's real tool server.
"""

import asyncio
import socket

import pytest
from aiohttp import web

from tool_server.client import ToolClient, ToolServerError, http_healthy, parse_observation


class ProtocolServer:
    def __init__(self):
        self.requests = []
        self.fail_next = 0  # answer HTTP 503 this many times
        self.delay_s = 0.0

    async def handle(self, request):
        body = await request.json()
        self.requests.append(body)
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.Response(status=503, text="busy")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        obs = []
        for a, fin in zip(body["actions"], body["finish"]):
            if fin:
                obs.append("")
            elif a.startswith("img"):
                obs.append({"obs": "an image", "image": "data:image/png;base64,AAA", "reward": 0.5})
            else:
                obs.append(f"echo:{a}")
        return web.json_response(
            {
                "observations": obs,
                "dones": [a == "stop" for a in body["actions"]],
                "valids": [not a.startswith("bad") for a in body["actions"]],
            }
        )


@pytest.fixture
async def server():
    srv = ProtocolServer()
    app = web.Application()
    app.router.add_post("/get_observation", srv.handle)

    async def health(_request):
        return web.json_response({"status": "ok"})

    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    srv.url = f"http://127.0.0.1:{port}"
    yield srv
    await runner.cleanup()


async def test_protocol_fields_and_results(server):
    async with ToolClient(server.url) as c:
        assert await asyncio.to_thread(http_healthy, server.url)
        # one replica answering is enough: the client routes around the dead one
        assert await asyncio.to_thread(http_healthy, f"http://127.0.0.1:9,{server.url}", 0.5)
        r = await c.get_observation("t1", "hello", {"db": "x"})
        assert (r.observation, r.done, r.valid, r.extra) == ("echo:hello", False, True, {})
        assert r.latency_s > 0
        body = server.requests[-1]
        assert body == {
            "trajectory_ids": ["t1"],
            "actions": ["hello"],
            "extra_fields": [{"db": "x"}],
            "finish": [False],
            "is_last_step": [False],
        }
        rs = await c.get_observations(["a", "b", "c"], ["img1", "bad", "stop"])
        assert rs[0].observation == "an image" and rs[0].extra == {
            "image": "data:image/png;base64,AAA",
            "reward": 0.5,
        }
        assert [x.valid for x in rs] == [True, False, True]
        assert [x.done for x in rs] == [False, False, True]
        await c.finish(["a", "b"])
        assert server.requests[-1]["finish"] == [True, True]


async def test_retries_on_5xx_then_succeeds(server):
    server.fail_next = 2
    async with ToolClient(server.url, retries=2, backoff_s=0.01) as c:
        r = await c.get_observation("t", "x")
    assert r.observation == "echo:x"
    assert len(server.requests) == 3


async def test_persistent_5xx_raises_naming_the_server(server):
    server.fail_next = 10
    async with ToolClient(server.url, retries=1, backoff_s=0.01) as c:
        with pytest.raises(ToolServerError, match="HTTP 503"):
            await c.get_observation("t", "x")


async def test_timeout_is_an_observation_not_an_exception(server):
    server.delay_s = 2.0
    async with ToolClient(server.url, timeout_s=0.2) as c:
        r = await c.get_observation("t", "x")
    assert r.timed_out and not r.valid and "timed out" in r.observation
    assert len(server.requests) == 1  # a timed-out action is never re-sent


async def test_server_down_raises_after_retries():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    async with ToolClient(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.01) as c:
        with pytest.raises(ToolServerError, match="unreachable after 3 attempts"):
            await c.get_observation("t", "x")
    assert not http_healthy(f"http://127.0.0.1:{port}", timeout_s=0.5)
    # several replicas: healthy while any one answers (the client routes around the rest)
    assert not http_healthy(f"http://127.0.0.1:{port},http://127.0.0.1:{port}", timeout_s=0.5)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="url"):
        ToolClient("localhost:5000")
    with pytest.raises(ValueError, match="timeout_s"):
        ToolClient("http://x", timeout_s=0)
    assert parse_observation("a") == ("a", {})
    with pytest.raises(ToolServerError, match="obs"):
        parse_observation({"obs": 3})
