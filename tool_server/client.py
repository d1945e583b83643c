"""Asynchronous client of the tool server (the VerlTool wire protocol).

``POST /get_observation`` with ``{trajectory_ids, actions, extra_fields, finish,
is_last_step}`` returns ``{observations, dones, valids}``; an observation is a string or
an object with ``obs`` (and optionally ``image``, ``reward``, ``metrics``,
``invalid_reason``). One :class:`ToolClient` holds one pooled aiohttp session, so
thousands of concurrent trajectories share a bounded number of connections.

Failure policy:

* connection errors and HTTP 5xx are retried with exponential backoff
  (``retries`` times); if they persist, :class:`ToolServerError` is raised and the
  caller ends *that* trajectory; with an ``on_unreachable`` hook (the trainer's health
  guard), a server that stays unreachable is first handed to the hook, which restarts
  or waits for it, and the call is retried if it says the server is back;
* a call that exceeds ``timeout_s`` is *not* retried (the action may have had side
  effects): it returns a :class:`ToolResult` whose observation says the tool timed out,
  ``valid=False``, ``timed_out=True``, so the trajectory goes on with that observation.

Replicas: ``url`` may list several servers, comma-separated. A trajectory is routed by
rendezvous hashing of its id over the replicas (``blake2b(url | trajectory_id)``, the
highest score wins), so the same id always reaches the same replica, which holds its tool
state. A replica that stays unreachable after the retries is taken out of rotation: the
turns in flight on it, and later turns of trajectories that started on it (their state
is gone), fail with a :class:`ToolServerError` naming the replica; new trajectories hash
over the remaining replicas (rendezvous hashing moves no other trajectory). A dead
replica is probed again for new trajectories after ``revive_after_s``.

Health: :func:`http_healthy` is the one probe of a tool server (``GET /health``
answering 200). With several replicas it is True when *any* replica answers, the same
rule the client routes by: trajectories hash over the replicas still alive.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp


class ToolServerError(RuntimeError):
    """The tool server could not be reached or answered with an error after retries."""


class _Unreachable(ToolServerError):
    """Every attempt failed to connect (the server is down, not just erring)."""


@dataclass
class ToolResult:
    """One action's outcome: observation text, its extra payload, done/valid flags."""

    observation: str
    done: bool
    valid: bool
    extra: dict = field(default_factory=dict)  # image, reward, metrics, invalid_reason
    latency_s: float = 0.0
    timed_out: bool = False


def parse_observation(raw: Any) -> tuple[str, dict]:
    """Split a wire observation into ``(text, extra)``.

    A string is the text; a dict has its text under ``obs`` and everything else is the
    extra payload. Anything else is a protocol error.
    """
    if isinstance(raw, str):
        return raw, {}
    if isinstance(raw, dict):
        text = raw.get("obs", "")
        if not isinstance(text, str):
            raise ToolServerError(
                f"observation field 'obs' must be a string, got {type(text).__name__}"
            )
        return text, {k: v for k, v in raw.items() if k != "obs"}
    raise ToolServerError(
        f"an observation must be a string or an object with 'obs', got {type(raw).__name__}"
    )


def parse_tool_urls(url: str) -> list[str]:
    """``"http://a:1,http://b:2"`` -> ``["http://a:1", "http://b:2"]`` (validated, no
    trailing slash, no duplicates)."""
    if not isinstance(url, str):
        raise ValueError(f"tool server url must be a string, got {type(url).__name__}")
    urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
    if not urls:
        raise ValueError(
            "tool server url is empty; give http://host:port (several: comma-separated)"
        )
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ValueError(
                f"ToolClient url must start with http:// or https://, got {u!r} (in {url!r})"
            )
    if len(set(urls)) != len(urls):
        raise ValueError(f"tool server url lists a replica twice: {url!r}")
    return urls


def rendezvous_index(key: str, urls: Sequence[str], live: Sequence[bool]) -> int:
    """Rendezvous (highest-random-weight) hashing: the live ``i`` maximising
    ``blake2b(urls[i] + "|" + key)``. Stable across processes and runs; removing a replica
    moves only the keys that were on it."""
    best, best_score = -1, b""
    for i, u in enumerate(urls):
        if not live[i]:
            continue
        score = hashlib.blake2b(f"{u}|{key}".encode(), digest_size=8).digest()
        if best < 0 or score > best_score:
            best, best_score = i, score
    if best < 0:
        raise ToolServerError(
            f"every tool server replica is down ({', '.join(urls)}); restart them"
        )
    return best


class ToolClient:
    """Pooled async client of one tool server, or of several replicas (see module doc).

    Args:
      url: server base URL, e.g. ``http://127.0.0.1:5000``; several replicas:
        comma-separated.
      timeout_s: wall-clock limit of one call (client side).
      retries: how many times a connection error / HTTP 5xx is retried.
      backoff_s: first retry delay; doubled each retry.
      max_connections: size of the connection pool.
      on_unreachable: ``async () -> bool`` awaited when the server stays unreachable
        after the retries; True means it is back (the call is retried once more).
      revive_after_s: a replica found dead gets new trajectories again after this long.
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.1,
        max_connections: int = 256,
        revive_after_s: float = 60.0,
        max_tracked: int = 100_000,
        on_unreachable: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.urls = parse_tool_urls(url)
        if timeout_s <= 0:
            raise ValueError(f"ToolClient timeout_s must be > 0, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"ToolClient retries must be >= 0, got {retries}")
        if max_connections < 1:
            raise ValueError(f"ToolClient max_connections must be >= 1, got {max_connections}")
        self.url = self.urls[0]
        self.revive_after_s = float(revive_after_s)
        self.max_tracked = int(max_tracked)
        self._dead_since: list[float | None] = [None] * len(self.urls)
        self._home: OrderedDict[str, int] = OrderedDict()  # trajectory id -> replica
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_connections = int(max_connections)
        self.on_unreachable = on_unreachable
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- session ---------------------------------------------------------------------
    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # A session belongs to one event loop; a new loop (e.g. a new asyncio.run)
            # gets a new session.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self._loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> ToolClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- protocol --------------------------------------------------------------------
    # --- replicas --------------------------------------------------------------------
    def _live(self) -> list[bool]:
        now = time.monotonic()
        return [d is None or now - d >= self.revive_after_s for d in self._dead_since]

    @property
    def live_replicas(self) -> list[str]:
        return [u for u, ok in zip(self.urls, self._live()) if ok]

    def replica_for(self, trajectory_id: str) -> int:
        """The replica index of ``trajectory_id`` (remembered from its first call)."""
        if len(self.urls) == 1:
            return 0
        idx = self._home.get(trajectory_id)
        if idx == -1:
            raise ToolServerError(
                f"the tool server replica of trajectory {trajectory_id!r} "
                f"went down and held its tool state; the trajectory ends "
                f"here, the other replicas go on"
            )
        if idx is None:
            idx = rendezvous_index(trajectory_id, self.urls, self._live())
            self._home[trajectory_id] = idx
            while len(self._home) > self.max_tracked:
                self._home.popitem(last=False)
        return idx

    def _mark_dead(self, idx: int) -> None:
        """Replica ``idx`` is down: out of rotation, and its trajectories' state is lost."""
        self._dead_since[idx] = time.monotonic()
        for t, home in self._home.items():
            if home == idx:
                self._home[t] = -1

    def _forget(self, trajectory_ids: Sequence[str]) -> None:
        for t in trajectory_ids:
            self._home.pop(t, None)

    async def _post(self, path: str, payload: dict, base: str | None = None) -> dict:
        """POST json with retries on connection errors / 5xx (and one more round after
        ``on_unreachable`` brought a single server back); raise asyncio.TimeoutError."""
        try:
            return await self._post_retrying(path, payload, base)
        except _Unreachable as e:
            if self.on_unreachable is None or not await self.on_unreachable():
                raise ToolServerError(str(e)) from None
        try:
            return await self._post_retrying(path, payload, base)
        except _Unreachable as e:
            raise ToolServerError(str(e)) from None

    async def _post_retrying(self, path: str, payload: dict, base: str | None = None) -> dict:
        base = base or self.url
        session = self._get_session()
        delay = self.backoff_s
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                async with asyncio.timeout(self.timeout_s):
                    async with session.post(base + path, json=payload) as resp:
                        if resp.status >= 500:
                            body = await resp.text()
                            last = ToolServerError(
                                f"tool server {base}{path} answered "
                                f"HTTP {resp.status}: {body[:300]}"
                            )
                        elif resp.status >= 400:
                            body = await resp.text()
                            raise ToolServerError(
                                f"tool server {base}{path} rejected the "
                                f"request (HTTP {resp.status}): {body[:300]}"
                            )
                        else:
                            return await resp.json()
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                last = e
            if attempt < self.retries:
                await asyncio.sleep(delay)
                delay *= 2
        others = ""
        if len(self.urls) > 1 and isinstance(
            last, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
        ):
            self._mark_dead(self.urls.index(base))
            others = (
                f"; replica taken out of rotation, {len(self.live_replicas)} of "
                f"{len(self.urls)} left"
            )
        # A single server that stays unreachable may be restarted by ``on_unreachable``.
        err = (
            _Unreachable
            if len(self.urls) == 1 and isinstance(last, aiohttp.ClientConnectionError)
            else ToolServerError
        )
        raise err(
            f"tool server {base}{path} unreachable after "
            f"{self.retries + 1} attempts: {last!r}. Is it running?{others}"
        )

    async def get_observations(
        self,
        trajectory_ids: Sequence[str],
        actions: Sequence[str],
        extra_fields: Sequence[dict] | None = None,
        finish: Sequence[bool] | None = None,
        is_last_step: bool | Sequence[bool] = False,
    ) -> list[ToolResult]:
        """Send a batch of actions in one request; one :class:`ToolResult` per action.

        ``is_last_step`` is one flag per action (a single bool applies to all).
        On a client-side timeout every action of the batch gets a timed-out observation.
        """
        n = len(trajectory_ids)
        if len(actions) != n:
            raise ValueError(f"actions has {len(actions)} entries, trajectory_ids has {n}")
        if n == 0:  # the server answers an empty batch with 422 (as VerlTool's)
            return []
        extra_fields = list(extra_fields) if extra_fields is not None else [{} for _ in range(n)]
        finish = list(finish) if finish is not None else [False] * n
        last = (
            [bool(is_last_step)] * n
            if isinstance(is_last_step, bool)
            else [bool(x) for x in is_last_step]
        )
        if len(extra_fields) != n or len(finish) != n or len(last) != n:
            raise ValueError(
                "extra_fields, finish and is_last_step must have one entry per trajectory_id"
            )
        try:
            return await self._observe_all(
                list(trajectory_ids), list(actions), extra_fields, finish, last
            )
        finally:
            self._forget([t for t, f in zip(trajectory_ids, finish) if f])

    async def _observe_all(
        self, trajectory_ids: list, actions: list, extra_fields: list, finish: list, last: list
    ) -> list[ToolResult]:
        """Split a batch by replica, send the parts concurrently, merge in order; a part
        on a dead replica raises its ToolServerError after the others finished."""
        n = len(trajectory_ids)
        if len(self.urls) == 1:
            return await self._observe_on(
                0, list(trajectory_ids), list(actions), extra_fields, finish, last
            )
        else:
            groups: dict[int, list[int]] = {}
            for i, t in enumerate(trajectory_ids):
                groups.setdefault(self.replica_for(t), []).append(i)

            async def one(r: int, idx: list[int]):
                return await self._observe_on(
                    r,
                    [trajectory_ids[i] for i in idx],
                    [actions[i] for i in idx],
                    [extra_fields[i] for i in idx],
                    [finish[i] for i in idx],
                    [last[i] for i in idx],
                )

            results = await asyncio.gather(
                *(one(r, idx) for r, idx in groups.items()), return_exceptions=True
            )
            out: list[ToolResult | None] = [None] * n
            for (_r, idx), res in zip(groups.items(), results):
                if isinstance(res, BaseException):
                    raise res
                for i, v in zip(idx, res):
                    out[i] = v
        merged = [r for r in out if r is not None]
        assert len(merged) == n  # every index is in exactly one group
        return merged

    async def _observe_on(
        self,
        replica: int,
        trajectory_ids: list,
        actions: list,
        extra_fields: list,
        finish: list,
        last: list,
    ) -> list[ToolResult]:
        """One ``/get_observation`` request to replica ``replica``."""
        n = len(trajectory_ids)
        payload = {
            "trajectory_ids": trajectory_ids,
            "actions": actions,
            "extra_fields": extra_fields,
            "finish": [bool(f) for f in finish],
            "is_last_step": last,
        }
        t0 = time.perf_counter()
        try:
            body = await self._post("/get_observation", payload, self.urls[replica])
        except TimeoutError:
            lat = time.perf_counter() - t0
            msg = f"[tool call timed out after {self.timeout_s:g}s]"
            return [
                ToolResult(
                    msg,
                    done=False,
                    valid=False,
                    latency_s=lat,
                    timed_out=True,
                    extra={"invalid_reason": "timeout"},
                )
                for _ in range(n)
            ]
        lat = time.perf_counter() - t0
        try:
            obs, dones, valids = body["observations"], body["dones"], body["valids"]
        except (KeyError, TypeError) as e:
            raise ToolServerError(
                f"tool server reply lacks {e}; expected keys observations, dones, valids"
            ) from None
        if self._dead_since[replica] is not None:
            self._dead_since[replica] = None  # answered again: back in rotation
        if not (len(obs) == len(dones) == len(valids) == n):
            raise ToolServerError(f"tool server returned {len(obs)} observations for {n} actions")
        out = []
        for o, d, v in zip(obs, dones, valids):
            text, extra = parse_observation(o)
            out.append(ToolResult(text, done=bool(d), valid=bool(v), extra=extra, latency_s=lat))
        return out

    async def get_observation(
        self,
        trajectory_id: str,
        action: str,
        extra_field: dict | None = None,
        is_last_step: bool = False,
    ) -> ToolResult:
        """Run one trajectory's action (the asynchronous rollout's per-turn call)."""
        (res,) = await self.get_observations(
            [trajectory_id], [action], [extra_field or {}], [False], [is_last_step]
        )
        return res

    async def finish(self, trajectory_id: str | Sequence[str]) -> None:
        """Tell the server these trajectories ended, so it frees their state."""
        tids = [trajectory_id] if isinstance(trajectory_id, str) else list(trajectory_id)
        if not tids:
            return
        await self.get_observations(tids, [""] * len(tids), [{} for _ in tids], [True] * len(tids))


def http_healthy(url: str, timeout_s: float = 2.0) -> bool:
    """True if ``GET <url>/health`` answers 200 within ``timeout_s`` (a blocking call;
    from a coroutine use ``asyncio.to_thread``). ``url`` may list tool-server replicas
    separated by commas (``tool_server.url``): True if any of them answers, since the
    tool client routes around dead replicas (see the module doc)."""
    if "," in url:
        return any(http_healthy(u, timeout_s) for u in url.split(",") if u.strip())
    try:
        with urllib.request.urlopen(url.strip().rstrip("/") + "/health", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def fetch_tool_schemas(url: str, timeout_s: float = 10.0) -> list[dict]:
    """The OpenAI ``tools`` entries (``BaseTool.function_schema()``) of every tool the
    server at ``url`` serves (``GET /tools``; the first replica of a comma-separated
    list: replicas serve the same tools). Raises :class:`ToolServerError` naming the URL."""
    base = parse_tool_urls(url)[0]
    try:
        with urllib.request.urlopen(base + "/tools", timeout=timeout_s) as r:
            listed = json.loads(r.read())["tools"]
        return [dict(t["schema"]) for t in listed]
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as e:
        raise ToolServerError(f"cannot read the tool schemas from {base}/tools: {e!r}") from e
