"""The HTTP service (aiohttp): ``POST /get_observation``, ``GET /health``, ``GET /tools``."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

from aiohttp import web

from tool_server.dispatcher import Dispatcher
from tool_server.kit.base import BaseTool, ToolSettings
from tool_server.kit.plugins import PluginError
from tool_server.protocol import ProtocolError, parse_request
from tool_server.registry import discover_tools

log = logging.getLogger("tool_server")

DISPATCHER_KEY = web.AppKey("dispatcher", Dispatcher)
MAX_BODY_KEY = web.AppKey("max_body_bytes", int)


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data, ensure_ascii=False).encode(),
        status=status,
        content_type="application/json",
    )


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    body = {"error": message}
    if field:
        body["field"] = field
    return _json(body, status)


# Bodies at least this large are decoded in a thread, off the event loop.
_THREAD_DECODE_BYTES = 256 * 1024


def _decode_json(raw: bytes) -> object:
    """``json.loads`` that reports nesting too deep for the decoder as a ``ValueError``."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None


async def get_observation(request: web.Request) -> web.Response:
    dispatcher = request.app[DISPATCHER_KEY]
    settings = dispatcher.settings
    limit = request.app[MAX_BODY_KEY]
    if request.content_length is not None and request.content_length > limit:
        return _error(
            413,
            f"the request body has {request.content_length} bytes, over this "
            f"server's limit of {limit} (--max-request-mb); send fewer actions "
            "per request",
        )
    try:
        async with asyncio.timeout(settings.client_timeout_s):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _error(
            413,
            f"the request body is over this server's limit of {limit} bytes "
            "(--max-request-mb); send fewer actions per request",
        )
    except TimeoutError:
        return _error(
            408,
            f"the request body did not arrive within "
            f"{settings.client_timeout_s:g} s (--client-timeout)",
        )
    except ConnectionError:  # the client went away mid-body: nobody to answer
        return _error(400, "the connection was lost while reading the request body")
    try:
        if len(raw) >= _THREAD_DECODE_BYTES:
            body = await asyncio.to_thread(_decode_json, raw)
        else:
            body = _decode_json(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return _error(400, f"the request body is not valid JSON: {e}")
    try:
        req = parse_request(body, settings.max_batch)
    except ProtocolError as e:
        return _error(e.status, str(e), e.field)
    return _json(await dispatcher.handle(req))


async def health(request: web.Request) -> web.Response:
    return _json(request.app[DISPATCHER_KEY].health())


async def list_tools(request: web.Request) -> web.Response:
    tools = request.app[DISPATCHER_KEY].tools
    listed = [{"name": t.name, "usage": t.usage, "schema": t.function_schema()} for t in tools]
    return _json({"tools": listed})


def instantiate_tools(
    tools: Sequence[str | BaseTool],
    settings: ToolSettings,
    unusable: dict[str, str] | None = None,
) -> list[BaseTool]:
    """Tool names (looked up with :func:`discover_tools`) or ready instances -> instances.
    With ``unusable``, a requested plugin that cannot be used (a clash, a failed import)
    is left out and its problem, naming the package, recorded there; without, it raises."""
    names = [t for t in tools if isinstance(t, str)]
    classes = discover_tools(names, settings.tool_dirs, unusable) if names else {}
    out = []
    for t in tools:
        if isinstance(t, str) and t not in classes:
            continue  # recorded in unusable
        out.append(classes[t](settings) if isinstance(t, str) else t)
    seen = set()
    for t in out:
        if t.name in seen:
            raise ValueError(f"tool {t.name!r} is listed twice in --tools")
        seen.add(t.name)
    return out


def create_app(
    tools: Sequence[str | BaseTool], settings: ToolSettings | None = None
) -> web.Application:
    """The aiohttp application serving ``tools`` (names in routing order, or instances).

    A requested plugin tool that cannot be used does not stop the others: it is logged,
    left out (no tool claims its actions, so they are answered as invalid) and reported by
    ``/health`` under ``unavailable_tools`` with the reason, naming the package."""
    settings = settings or ToolSettings()
    unusable: dict[str, str] = {}
    served = instantiate_tools(tools, settings, unusable)
    for reason in unusable.values():
        log.error("%s; serving the other tools without it", reason)
    if not served and unusable:
        raise PluginError("no tool can be served: " + "; ".join(unusable.values()))
    dispatcher = Dispatcher(served, settings)
    dispatcher.unavailable_tools = unusable
    max_body = int(settings.max_request_mb * 1024 * 1024)
    app = web.Application(client_max_size=max_body)
    app[DISPATCHER_KEY] = dispatcher
    app[MAX_BODY_KEY] = max_body
    app.router.add_post("/get_observation", get_observation)
    app.router.add_get("/health", health)
    app.router.add_get("/tools", list_tools)

    async def on_startup(_app: web.Application) -> None:
        await dispatcher.start()

    async def on_cleanup(_app: web.Application) -> None:
        await dispatcher.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
