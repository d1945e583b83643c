"""The OpenAI-compatible gateway: an aiohttp server in front of one of our samplers.

Routes (``{key}`` is a trajectory key from :meth:`Gateway.open_episode` or
``POST /episodes``; a client may instead send it as its ``api_key``):

* ``POST /t/{key}/v1/chat/completions`` and ``POST /v1/chat/completions`` (Bearer key):
  OpenAI chat completions, non-streaming or ``stream: true`` (SSE); ``tools``,
  ``tool_choice``, assistant ``tool_calls`` and role ``tool`` as OpenAI defines them.
* ``GET /t/{key}/v1/models``, ``GET /v1/models``: the one served model.
* ``POST /t/{key}/reward`` ``{"reward": float}``: the program's reward for the episode.
* ``POST /t/{key}/end`` (optional ``{"reward": float}``): closes the episode; its calls
  become trajectories (``episodes.Episode.trajectories``), handed to :meth:`Gateway.wait`
  and the ``finished`` queue.
* ``POST /episodes`` ``{"group_id", "data"}`` -> ``{"key", "base_url"}``: the trainer side
  opens an episode over HTTP.

Every failure answers an OpenAI error body ``{"error": {"message", "type", "param",
"code"}}``. An episode idle for ``episode_timeout_s``, aborted, or whose call failed
after the sampler was asked, is dropped and counted, never trained on. Streaming sends
the finished completion as SSE chunks (the sampler interface returns whole turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from verltool_jax.chat.render import (
    DEFAULT_TOOL_PROMPT,
    TOOL_PROMPTS,
    RenderError,
    continuation,
    render_messages,
    template_of,
)
from verltool_jax.chat.tool_parsers import FORMATS, parse_tool_calls
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.samplers.base import (
    Completion,
    SamplerError,
    SamplerRequestError,
    SamplingParams,
)

from .episodes import Episode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayConfig:
    model: str = "policy"  # the name /v1/models reports and requests may use
    tool_format: str = "hermes"  # tool_parsers.FORMATS
    # the tool block when the chat template takes no tools= (render.TOOL_PROMPTS)
    tool_prompt: str = DEFAULT_TOOL_PROMPT
    max_model_len: int = 2048  # prompt + completion tokens of one call
    default_max_tokens: int = (
        512  # when a request gives neither max_tokens nor max_completion_tokens
    )
    episode_timeout_s: float = 600.0  # an episode idle this long is dropped
    sweep_every_s: float = 5.0

    def __post_init__(self) -> None:
        if self.tool_format not in FORMATS:
            raise ValueError(
                f"GatewayConfig.tool_format {self.tool_format!r} is not one of {FORMATS}"
            )
        if self.tool_prompt not in TOOL_PROMPTS:
            raise ValueError(
                f"GatewayConfig.tool_prompt {self.tool_prompt!r} is not one of "
                f"{sorted(TOOL_PROMPTS)}"
            )
        if self.max_model_len < 2 or self.default_max_tokens < 1:
            raise ValueError("GatewayConfig.max_model_len must be >= 2, default_max_tokens >= 1")
        if self.episode_timeout_s <= 0:
            raise ValueError("GatewayConfig.episode_timeout_s must be > 0")


class ApiError(Exception):
    """An OpenAI-style error answer."""

    def __init__(
        self, status: int, message: str, *, kind: str = "invalid_request_error",
        param: str | None = None, code: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code

    def response(self) -> web.Response:
        body = {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}
        return web.json_response({"error": body}, status=self.status)


_FLOAT_FIELDS = ("temperature", "top_p")


def sampling_params(body: dict, prompt_len: int, cfg: GatewayConfig) -> SamplingParams:
    """The request's sampling fields as :class:`SamplingParams`; 400 naming the field."""
    room = cfg.max_model_len - prompt_len
    if room < 1:
        raise ApiError(
            400,
            f"this conversation is {prompt_len} tokens, the model's context is "
            f"{cfg.max_model_len}: shorten the messages",
            param="messages",
            code="context_length_exceeded",
        )
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    if mt is None:
        mt = min(cfg.default_max_tokens, room)
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        raise ApiError(
            400, f"max_tokens must be a positive integer, got {mt!r}", param="max_tokens"
        )
    if mt > room:
        raise ApiError(
            400,
            f"{prompt_len} prompt tokens + max_tokens {mt} exceed the context of "
            f"{cfg.max_model_len}: lower max_tokens to at most {room}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    kw: dict[str, Any] = {"max_tokens": mt}
    for f in _FLOAT_FIELDS:
        v = body.get(f)
        if v is not None:
            if not isinstance(v, int | float) or isinstance(v, bool):
                raise ApiError(400, f"{f} must be a number, got {v!r}", param=f)
            kw[f] = float(v)
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise ApiError(
                400, "stop must be a string or a list of non-empty strings", param="stop"
            )
        kw["stop"] = tuple(stop)
    if body.get("seed") is not None:
        if not isinstance(body["seed"], int):
            raise ApiError(400, "seed must be an integer", param="seed")
        kw["seed"] = body["seed"]
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        raise ApiError(400, str(e), param=str(e).split()[0].split(".")[-1]) from None


class Gateway:
    """The gateway over ``sampler`` (any :class:`~verltool_jax.samplers.base.Sampler`) and the
    policy's ``tokenizer`` (its chat template renders every request)."""

    def __init__(self, sampler: Any, tokenizer: Any, config: GatewayConfig | None = None) -> None:
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.config = config or GatewayConfig()
        self.template = template_of(tokenizer)
        self.episodes: dict[str, Episode] = {}
        # sampling fields fixed for every call of an episode, over what the request asks
        # (the trainer fixes temperature, top_p, top_k: its loss assumes them)
        self.sampling: dict[str, Any] = {}
        self.stats: Counter[str] = Counter()
        self.finished: asyncio.Queue[tuple[str, list[Trajectory]]] | None = None
        self._results: dict[str, asyncio.Future] = {}
        self._eos_text = {
            int(i): tokenizer.decode([int(i)]) for i in self._eos_ids()
        }  # stripped from the reply text the client sees
        self._runner: web.AppRunner | None = None
        self._sweeper: asyncio.Task | None = None
        self.base_url = ""

    def _eos_ids(self) -> list[int]:
        ids = getattr(self.sampler, "eos_token_ids", None)
        if ids is None:
            e = getattr(self.tokenizer, "eos_token_id", None)
            ids = [] if e is None else [e]
        return list(ids)

    # ------------------------------------------------------------------ episodes
    def open_episode(
        self,
        group_id: str = "",
        data: dict | None = None,
        key: str | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> str:
        """A new trajectory key (the client's ``api_key``, or its base URL via :meth:`url`);
        ``sampling``: fields fixed for its calls (default :attr:`sampling`)."""
        key = key or "traj-" + uuid.uuid4().hex
        if key in self.episodes:
            raise ValueError(f"trajectory key {key!r} is already open")
        ep = Episode(key, group_id or key, dict(data or {}))
        ep.sampling = dict(self.sampling if sampling is None else sampling)
        self.episodes[key] = ep
        self._results[key] = asyncio.get_running_loop().create_future()
        self.stats["opened"] += 1
        return key

    def url(self, key: str) -> str:
        """The OpenAI ``base_url`` of one trajectory."""
        return f"{self.base_url}/t/{key}/v1"

    async def wait(self, key: str) -> list[Trajectory]:
        """The episode's trajectories once it ends; raises RuntimeError if it failed."""
        fut = self._results.get(key)
        if fut is None:
            raise KeyError(f"no episode {key!r}")
        try:
            return await fut
        finally:
            self._results.pop(key, None)

    def end(self, key: str, reward: float | None = None) -> list[Trajectory]:
        ep = self._episode(key)
        if ep.in_flight:
            raise ApiError(
                409, f"trajectory {key} has {ep.in_flight} call(s) in flight; end it after they return",
                code="calls_in_flight",
            )  # fmt: skip
        if reward is not None:
            ep.reward = float(reward)
            ep.reward_info["program_reward"] = float(reward)
        del self.episodes[key]
        if not ep.samples:
            self._fail(ep, "ended without any call")
            return []
        trajs = ep.trajectories()
        self.stats["ended"] += 1
        self.stats["samples"] += len(trajs)
        for k, v in ep.counts.items():
            self.stats[f"turns_{k}"] += v
        self._deliver(key, trajs, None)
        return trajs

    def abort(self, key: str, reason: str) -> None:
        """Drop an open episode (never trained on)."""
        ep = self.episodes.pop(key, None)
        if ep is not None:
            self._fail(ep, reason)

    def _fail(self, ep: Episode, reason: str) -> None:
        self.episodes.pop(ep.key, None)
        ep.error = reason
        self.stats["failed"] += 1
        log.warning("gateway: episode %s dropped: %s", ep.key, reason)
        self._deliver(ep.key, None, reason)

    def _deliver(self, key: str, trajs: list[Trajectory] | None, err: str | None) -> None:
        fut = self._results.get(key)
        if fut is not None and not fut.done():
            if trajs is None:
                fut.set_exception(RuntimeError(f"episode {key} failed: {err}"))
                fut.exception()  # retrieved: nobody may be waiting
            else:
                fut.set_result(trajs)
        if trajs is not None and self.finished is not None:
            self.finished.put_nowait((key, trajs))

    def _episode(self, key: str | None) -> Episode:
        ep = self.episodes.get(key or "")
        if ep is None:
            raise ApiError(
                401,
                f"unknown or closed trajectory key {key!r}: use a key the trainer opened "
                "(as api_key or in the base URL /t/<key>/v1)",
                kind="authentication_error",
                code="invalid_api_key",
            )
        return ep

    def sweep(self, now: float | None = None) -> int:
        """Drop episodes idle longer than ``episode_timeout_s``; how many were dropped."""
        now = time.monotonic() if now is None else now
        old = [
            ep
            for ep in self.episodes.values()
            if not ep.in_flight and now - ep.last_active > self.config.episode_timeout_s
        ]
        for ep in old:
            self.stats["timed_out"] += 1
            self._fail(ep, f"no call or end for {self.config.episode_timeout_s} s (timeout)")
        return len(old)

    # ------------------------------------------------------------------ one call
    async def chat(self, key: str | None, body: Any) -> tuple[dict, Completion]:
        """Run one chat completion for episode ``key``; the OpenAI response object."""
        ep = self._episode(key)
        if ep.in_flight:
            raise ApiError(
                409,
                f"trajectory {ep.key} already has a call in flight; one trajectory's calls "
                "are sequential (open one key per concurrent conversation)",
                code="call_in_flight",
            )
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("n", 1) != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        model = body.get("model")
        if model is not None and model != self.config.model:
            raise ApiError(
                404, f"model {model!r} is not served here; use {self.config.model!r}",
                param="model", code="model_not_found",
            )  # fmt: skip
        tools = body.get("tools") or None
        if tools is not None and (
            not isinstance(tools, list)
            or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)
        ):
            raise ApiError(
                400, "tools must be a list of {type: function, function: {...}}", param="tools"
            )
        choice = body.get("tool_choice", "auto")
        if choice == "none":
            tools = None
        try:
            text, ids = render_messages(
                self.tokenizer, body.get("messages"), tools, raw_replies=ep.raw_replies,
                fmt=self.config.tool_format, tool_prompt=self.config.tool_prompt,
                template=self.template,
            )  # fmt: skip
        except RenderError as e:
            raise ApiError(400, str(e), param=e.param) from None
        params = sampling_params(body, len(ids), self.config)
        if ep.samples:
            s = ep.samples[-1]
            c = continuation(s.ids, s.text, ids, text, self.tokenizer)
            kind, prompt = c.kind, c.prompt_ids
            if kind == "splice":
                params = sampling_params(body, len(prompt), self.config)
            if kind == "break":
                log.info("gateway: %s turn %d starts a new sample (template rewrote history)",
                         key, sum(ep.counts.values()))  # fmt: skip
        else:
            kind, prompt = "first", ids
        if ep.sampling:
            params = dataclasses.replace(params, **ep.sampling)
        ep.in_flight += 1
        t0 = time.perf_counter()
        try:
            comp = await self.sampler.generate(prompt, params, request_id=key)
        except SamplerRequestError as e:
            raise ApiError(400, str(e)) from None
        except SamplerError as e:
            self._fail(ep, f"sampler failed: {e}")
            raise ApiError(503, f"the sampler failed: {e}", kind="server_error") from None
        finally:
            ep.in_flight -= 1
        dt = time.perf_counter() - t0
        if self.episodes.get(ep.key) is not ep:  # aborted or timed out meanwhile
            raise ApiError(
                409, f"trajectory {ep.key} was closed during this call", code="episode_closed"
            )
        ids_out = list(comp.token_ids)
        full_text = self.tokenizer.decode(ids_out, skip_special_tokens=False)
        shown = ids_out[:-1] if ids_out and ids_out[-1] in self._eos_text else ids_out
        reply = self.tokenizer.decode(shown, skip_special_tokens=False)
        ep.record(kind, prompt, text, comp, full_text, dt)
        return self._response(ep, reply, comp, prompt, tools is not None, body), comp

    def _response(
        self, ep: Episode, reply: str, comp: Completion, prompt: list[int], parse: bool, body: dict
    ) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": reply}
        finish = "length" if comp.finish_reason == "length" else "stop"
        if parse:
            p = parse_tool_calls(reply, self.config.tool_format)
            ep.invalid_tool_calls += len(p.errors)
            if p.errors:
                self.stats["invalid_tool_calls"] += len(p.errors)
            if p.calls:
                ep.tool_calls += len(p.calls)
                message["content"] = p.content or None
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in p.calls
                ]
                for c in p.calls:
                    ep.raw_replies[c.id] = reply
                finish = "tool_calls"
            if p.reasoning is not None:
                message["reasoning_content"] = p.reasoning
        if "tool_calls" not in message:
            ep.raw_replies["content:" + reply] = reply
        out: dict[str, Any] = {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(comp.token_ids),
                "total_tokens": len(prompt) + len(comp.token_ids),
            },
            "system_fingerprint": f"policy-v{comp.policy_version}",
        }
        if body.get("logprobs"):
            out["choices"][0]["logprobs"] = {
                "content": [
                    {
                        "token": self.tokenizer.decode([t]),
                        "logprob": lp,
                        "bytes": None,
                        "top_logprobs": [],
                    }
                    for t, lp in zip(comp.token_ids, comp.logprobs)
                ]
            }
        return out

    # ------------------------------------------------------------------ HTTP
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/chat/completions", self._h_chat)
        app.router.add_post("/t/{key}/v1/chat/completions", self._h_chat)
        app.router.add_get("/v1/models", self._h_models)
        app.router.add_get("/t/{key}/v1/models", self._h_models)
        app.router.add_post("/t/{key}/end", self._h_end)
        app.router.add_post("/t/{key}/reward", self._h_reward)
        app.router.add_post("/episodes", self._h_open)
        app.router.add_get("/health", self._h_health)
        return app

    @staticmethod
    def _key(request: web.Request) -> str | None:
        key = request.match_info.get("key")
        if key:
            return key
        auth = request.headers.get("Authorization", "")
        return auth[7:].strip() if auth.startswith("Bearer ") else None

    @staticmethod
    async def _json(request: web.Request, required: bool = True) -> Any:
        raw = await request.read()
        if not raw and not required:
            return {}
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None

    async def _h_chat(self, request: web.Request) -> web.StreamResponse:
        self.stats["requests"] += 1
        try:
            body = await self._json(request)
            out, _ = await self.chat(self._key(request), body)
        except ApiError as e:
            self.stats[f"error_{e.status}"] += 1
            return e.response()
        if isinstance(body, dict) and body.get("stream"):
            return await self._stream(
                request, out, bool((body.get("stream_options") or {}).get("include_usage"))
            )
        return web.json_response(out)

    async def _stream(self, request: web.Request, out: dict, usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        head = {k: out[k] for k in ("id", "created", "model", "system_fingerprint")}
        head["object"] = "chat.completion.chunk"
        msg, ch = out["choices"][0]["message"], out["choices"][0]

        async def send(delta: dict, finish: str | None = None, **extra: Any) -> None:
            chunk = {
                **head,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            }
            chunk.update(extra)
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        await send({"role": "assistant", "content": ""})
        if msg.get("content"):
            await send({"content": msg["content"]})
        for i, c in enumerate(msg.get("tool_calls") or []):
            await send({"tool_calls": [{"index": i, **c}]})
        await send({}, ch["finish_reason"])
        if usage:
            await resp.write(
                b"data: "
                + json.dumps({**head, "choices": [], "usage": out["usage"]}).encode()
                + b"\n\n"
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _h_models(self, request: web.Request) -> web.Response:
        key = self._key(request)
        if request.match_info.get("key"):
            try:
                self._episode(key)
            except ApiError as e:
                return e.response()
        m = {"id": self.config.model, "object": "model", "created": 0, "owned_by": "verltool-jax"}
        return web.json_response({"object": "list", "data": [m]})

    async def _h_end(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request, required=False)
            reward = body.get("reward") if isinstance(body, dict) else None
            if reward is not None and (
                not isinstance(reward, int | float) or isinstance(reward, bool)
            ):
                raise ApiError(400, f"reward must be a number, got {reward!r}", param="reward")
            trajs = self.end(request.match_info["key"], reward)
        except ApiError as e:
            return e.response()
        return web.json_response({"ended": True, "samples": len(trajs)})

    async def _h_reward(self, request: web.Request) -> web.Response:
        try:
            ep = self._episode(request.match_info["key"])
            body = await self._json(request)
            reward = body.get("reward") if isinstance(body, dict) else None
            if not isinstance(reward, int | float) or isinstance(reward, bool):
                raise ApiError(400, f"reward must be a number, got {reward!r}", param="reward")
        except ApiError as e:
            return e.response()
        ep.reward = float(reward)
        ep.reward_info["program_reward"] = float(reward)
        ep.last_active = time.monotonic()
        return web.json_response({"reward": ep.reward})

    async def _h_open(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request, required=False)
            if not isinstance(body, dict) or not isinstance(body.get("data", {}), dict):
                raise ApiError(400, "body must be {group_id?: str, data?: object}", param="data")
            key = self.open_episode(str(body.get("group_id") or ""), body.get("data"))
        except ApiError as e:
            return e.response()
        return web.json_response({"key": key, "base_url": self.url(key)})

    async def _h_health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "open_episodes": len(self.episodes), **self.stats})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0: a free port) in the running loop; the base URL."""
        self.finished = asyncio.Queue()
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.base_url = f"http://{host}:{sock.getsockname()[1]}"
        self._sweeper = asyncio.create_task(self._sweep_loop())
        return self.base_url

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_every_s)
            self.sweep()

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._runner is not None:
            await self._runner.cleanup()


class GatewayThread:
    """A :class:`Gateway` served from its own event loop in a daemon thread (for synchronous
    programs, the example and tests). ``call(coro_fn)`` runs a coroutine function there."""

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> None:
        self.gateway = gateway
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway", daemon=True)
        self._thread.start()
        self.base_url = self.call(lambda: gateway.start(host, port))

    def call(self, fn: Any, timeout: float = 600.0) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout)

    def open_episode(self, group_id: str = "", data: dict | None = None) -> str:
        async def _open() -> str:
            return self.gateway.open_episode(group_id, data)

        return self.call(_open)

    def wait(self, key: str, timeout: float = 600.0) -> list[Trajectory]:
        return self.call(lambda: self.gateway.wait(key), timeout)

    def close(self) -> None:
        self.call(self.gateway.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
