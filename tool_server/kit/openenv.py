"""OpenEnv's environment protocol, client side, for the ``openenv`` tool and task.

An OpenEnv server (``openenv-core``'s ``create_app``) keeps one environment per WebSocket
connection at ``/ws``. The client sends ``{"type": "reset", "data": {kwargs}}``,
``{"type": "step", "data": {action fields}}`` and ``{"type": "close"}``; the server answers
``{"type": "observation", "data": {"observation": {...}, "reward": r | null, "done": b}}``
or ``{"type": "error", "data": {"message", "code"}}``. :class:`OpenEnvSession` speaks it
over aiohttp (a dependency already), so the tool server needs no ``openenv-core`` (whose
import pulls in gradio); tests check it against OpenEnv's own server.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

SEED_FIELD = "openenv_seed"  # the row's extra_info key of the episode's reset seed
MAX_MESSAGE_BYTES = 100 * 1024 * 1024  # OpenEnv's client default (screenshots, DOMs)


class OpenEnvError(RuntimeError):
    """The environment server answered with an error (e.g. an action it rejects)."""


@dataclass
class EnvStep:
    """One answer of the environment: its observation fields, reward and done flag."""

    observation: dict
    reward: float | None
    done: bool


def observation_text(obs: dict, field: str = "") -> str:
    """The text the policy reads of an OpenEnv observation dict: ``obs[field]`` (a string
    as it is, anything else as JSON), or with no ``field`` every field as sorted JSON."""
    if field:
        if field not in obs:
            raise KeyError(
                f"the observation has no field {field!r} (it has {sorted(obs)}); "
                "set the openenv_obs_field tool option to one of them"
            )
        value = obs[field]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return json.dumps(obs, ensure_ascii=False, sort_keys=True)


class OpenEnvSession:
    """One episode on an OpenEnv server (``http://host:port`` or ``ws://...``): use as
    ``async with OpenEnvSession(url) as env: await env.reset(seed=1); await env.step({...})``."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        if not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"an OpenEnv server URL is http(s):// or ws(s)://, got {url!r}")
        self.url = url.rstrip("/") + "/ws"
        self.timeout_s = float(timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    async def open(self) -> OpenEnvSession:
        self._http = aiohttp.ClientSession()
        try:
            self._ws = await self._http.ws_connect(
                self.url,
                max_msg_size=MAX_MESSAGE_BYTES,
                timeout=aiohttp.ClientWSTimeout(ws_receive=self.timeout_s, ws_close=5.0),
            )
        except (aiohttp.ClientError, OSError) as e:
            await self.close()
            raise ConnectionError(f"cannot reach the OpenEnv server at {self.url}: {e}") from e
        return self

    async def _call(self, message: dict) -> dict:
        if self._ws is None:
            await self.open()
        assert self._ws is not None  # open() set it or raised
        await self._ws.send_str(json.dumps(message))
        msg = await asyncio.wait_for(self._ws.receive(), self.timeout_s)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"the OpenEnv server closed the session ({msg.type.name})")
        resp = json.loads(msg.data)
        data = resp.get("data") or {}
        if resp.get("type") == "error":
            raise OpenEnvError(f"{data.get('message', 'error')} ({data.get('code', '?')})")
        return data

    @staticmethod
    def _step(data: dict) -> EnvStep:
        reward = data.get("reward")
        return EnvStep(
            dict(data.get("observation") or {}),
            None if reward is None else float(reward),
            bool(data.get("done", False)),
        )

    async def reset(self, **kwargs: Any) -> EnvStep:
        return self._step(await self._call({"type": "reset", "data": kwargs}))

    async def step(self, action: dict) -> EnvStep:
        return self._step(await self._call({"type": "step", "data": action}))

    async def close(self) -> None:
        ws, http, self._ws, self._http = self._ws, self._http, None, None
        if ws is not None and not ws.closed:
            try:
                await ws.send_str(json.dumps({"type": "close"}))
                # the server closes the connection itself: wait for that, so that its
                # close does not race ours (OpenEnv logs a disconnect error then)
                await asyncio.wait_for(ws.receive(), 5.0)
            except (aiohttp.ClientError, ConnectionError, RuntimeError, TimeoutError):
                pass  # the server is gone: nothing to tell it
            await ws.close()
        if http is not None:
            await http.close()

    async def __aenter__(self) -> OpenEnvSession:
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
