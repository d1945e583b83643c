"""A local HTTP server that speaks the Serper JSON API, for tests and benchmarks.

It runs in its own thread and event loop, so synchronous code, async code and other
processes (a tool server under test) can all reach it at ``api.url``. Answers
``POST /search {"q", "num"}`` with ten made-up ``organic`` results derived from the
query. Knobs: ``fail_with`` (status codes to answer first, one per request),
``retry_after`` (header sent with those), ``delay_s`` (latency of every answer),
``api_key`` (the key required in ``X-API-KEY``; others get 403). Every request is
recorded in ``requests`` (body and key), and ``max_in_flight`` is the peak concurrency.
"""

from __future__ import annotations

import asyncio
import socket
import threading

from aiohttp import web


class FakeSearchAPI:
    def __init__(self, api_key: str, delay_s: float = 0.0) -> None:
        self.api_key = api_key
        self.requests: list[dict] = []
        self.fail_with: list[int] = []
        self.retry_after: str | None = None
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/search"
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fake-search-api")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake search API did not start")

    def reset(self) -> None:
        self.requests.clear()
        self.fail_with = []
        self.retry_after = None
        self.delay_s = 0.0
        self.max_in_flight = 0

    @staticmethod
    def results_for(query: str, n: int = 10) -> list[dict]:
        return [
            {
                "title": f"{query} result {i}",
                "link": f"https://example.org/{i}",
                "snippet": f"About {query}: fact number {i}.",
                "position": i,
            }
            for i in range(1, n + 1)
        ]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = request.headers.get("X-API-KEY")
        self.requests.append({"body": body, "key": key})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if key != self.api_key:
                return web.json_response({"message": "Unauthorized"}, status=403)
            if self.fail_with:
                status = self.fail_with.pop(0)
                headers = {"Retry-After": self.retry_after} if self.retry_after else {}
                return web.Response(status=status, text="try later", headers=headers)
            q = str(body.get("q", ""))
            return web.json_response({"searchParameters": {"q": q}, "organic": self.results_for(q)})
        finally:
            self.in_flight -= 1

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/search", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(
            web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024).start()
        )
        self._ready.set()
        self._loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
