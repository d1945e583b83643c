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
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence, Union

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
    extra: dict = field(default_factory=dict)   # image, reward, metrics, invalid_reason
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
            raise ToolServerError(f"observation field 'obs' must be a string, got "
                                  f"{type(text).__name__}")
        return text, {k: v for k, v in raw.items() if k != "obs"}
    raise ToolServerError(f"an observation must be a string or an object with 'obs', got "
                          f"{type(raw).__name__}")


class ToolClient:
    """Pooled async client of one tool server.

    Args:
      url: server base URL, e.g. ``http://127.0.0.1:5000``.
      timeout_s: wall-clock limit of one call (client side).
      retries: how many times a connection error / HTTP 5xx is retried.
      backoff_s: first retry delay; doubled each retry.
      max_connections: size of the connection pool.
      on_unreachable: ``async () -> bool`` awaited when the server stays unreachable
        after the retries; True means it is back (the call is retried once more).
    """

    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 3,
                 backoff_s: float = 0.1, max_connections: int = 256,
                 on_unreachable: Optional[Callable[[], Awaitable[bool]]] = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"ToolClient url must start with http:// or https://, got {url!r}")
        if timeout_s <= 0:
            raise ValueError(f"ToolClient timeout_s must be > 0, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"ToolClient retries must be >= 0, got {retries}")
        if max_connections < 1:
            raise ValueError(f"ToolClient max_connections must be >= 1, got {max_connections}")
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_connections = int(max_connections)
        self.on_unreachable = on_unreachable
        self._session: Optional[aiohttp.ClientSession] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    # --- session ---------------------------------------------------------------------
    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # A session belongs to one event loop; a new loop (e.g. a new asyncio.run)
            # gets a new session.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(total=None))
            self._loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> "ToolClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- protocol --------------------------------------------------------------------
    async def _post(self, path: str, payload: dict) -> dict:
        """POST json with retries on connection errors / 5xx (and one more round after
        ``on_unreachable`` brought the server back); raise asyncio.TimeoutError."""
        try:
            return await self._post_retrying(path, payload)
        except _Unreachable as e:
            if self.on_unreachable is None or not await self.on_unreachable():
                raise ToolServerError(str(e)) from None
        try:
            return await self._post_retrying(path, payload)
        except _Unreachable as e:
            raise ToolServerError(str(e)) from None

    async def _post_retrying(self, path: str, payload: dict) -> dict:
        session = self._get_session()
        delay = self.backoff_s
        last: Optional[BaseException] = None
        for attempt in range(self.retries + 1):
            try:
                async with asyncio.timeout(self.timeout_s):
                    async with session.post(self.url + path, json=payload) as resp:
                        if resp.status >= 500:
                            body = await resp.text()
                            last = ToolServerError(f"tool server {self.url}{path} answered "
                                                   f"HTTP {resp.status}: {body[:300]}")
                        elif resp.status >= 400:
                            body = await resp.text()
                            raise ToolServerError(f"tool server {self.url}{path} rejected the "
                                                  f"request (HTTP {resp.status}): {body[:300]}")
                        else:
                            return await resp.json()
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                last = e
            if attempt < self.retries:
                await asyncio.sleep(delay)
                delay *= 2
        err = _Unreachable if isinstance(last, aiohttp.ClientConnectionError) else ToolServerError
        raise err(f"tool server {self.url}{path} unreachable after {self.retries + 1} "
                  f"attempts: {last!r}. Is it running?")

    async def get_observations(self, trajectory_ids: Sequence[str], actions: Sequence[str],
                               extra_fields: Optional[Sequence[dict]] = None,
                               finish: Optional[Sequence[bool]] = None,
                               is_last_step: Union[bool, Sequence[bool]] = False
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
        last = ([bool(is_last_step)] * n if isinstance(is_last_step, bool)
                else [bool(x) for x in is_last_step])
        if len(extra_fields) != n or len(finish) != n or len(last) != n:
            raise ValueError("extra_fields, finish and is_last_step must have one entry per "
                             "trajectory_id")
        payload = {"trajectory_ids": list(trajectory_ids), "actions": list(actions),
                   "extra_fields": extra_fields, "finish": [bool(f) for f in finish],
                   "is_last_step": last}
        t0 = time.perf_counter()
        try:
            body = await self._post("/get_observation", payload)
        except TimeoutError:
            lat = time.perf_counter() - t0
            msg = f"[tool call timed out after {self.timeout_s:g}s]"
            return [ToolResult(msg, done=False, valid=False, latency_s=lat, timed_out=True,
                               extra={"invalid_reason": "timeout"}) for _ in range(n)]
        lat = time.perf_counter() - t0
        try:
            obs, dones, valids = body["observations"], body["dones"], body["valids"]
        except (KeyError, TypeError) as e:
            raise ToolServerError(f"tool server reply lacks {e}; expected keys "
                                  f"observations, dones, valids") from None
        if not (len(obs) == len(dones) == len(valids) == n):
            raise ToolServerError(f"tool server returned {len(obs)} observations for {n} actions")
        out = []
        for o, d, v in zip(obs, dones, valids):
            text, extra = parse_observation(o)
            out.append(ToolResult(text, done=bool(d), valid=bool(v), extra=extra, latency_s=lat))
        return out

    async def get_observation(self, trajectory_id: str, action: str,
                              extra_field: Optional[dict] = None,
                              is_last_step: bool = False) -> ToolResult:
        """Run one trajectory's action (the asynchronous rollout's per-turn call)."""
        (res,) = await self.get_observations([trajectory_id], [action],
                                             [extra_field or {}], [False], [is_last_step])
        return res

    async def finish(self, trajectory_id: str | Sequence[str]) -> None:
        """Tell the server these trajectories ended, so it frees their state."""
        tids = [trajectory_id] if isinstance(trajectory_id, str) else list(trajectory_id)
        if not tids:
            return
        await self.get_observations(tids, [""] * len(tids), [{} for _ in tids],
                                    [True] * len(tids))

    async def health(self) -> bool:
        """True if ``GET /health`` answers 200."""
        session = self._get_session()
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.get(self.url + "/health") as resp:
                    return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False
