"""The HTTP service (aiohttp): ``POST /get_observation``, ``GET /health``, ``GET /tools``."""
from __future__ import annotations

import json
import logging
from typing import Optional, Sequence

from aiohttp import web

from tool_server.dispatcher import Dispatcher
from tool_server.protocol import ProtocolError, parse_request
from tool_server.registry import discover_tools
from tool_server.kit.base import BaseTool, ToolSettings

log = logging.getLogger("tool_server")

DISPATCHER_KEY = web.AppKey("dispatcher", Dispatcher)


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, ensure_ascii=False).encode(), status=status,
                        content_type="application/json")


def _error(status: int, message: str, field: Optional[str] = None) -> web.Response:
    body = {"error": message}
    if field:
        body["field"] = field
    return _json(body, status)


async def get_observation(request: web.Request) -> web.Response:
    dispatcher = request.app[DISPATCHER_KEY]
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return _error(400, f"the request body is not valid JSON: {e}")
    try:
        req = parse_request(body)
    except ProtocolError as e:
        return _error(e.status, str(e), e.field)
    return _json(await dispatcher.handle(req))


async def health(request: web.Request) -> web.Response:
    return _json(request.app[DISPATCHER_KEY].health())


async def list_tools(request: web.Request) -> web.Response:
    tools = request.app[DISPATCHER_KEY].tools
    return _json({"tools": [{"name": t.name, "usage": t.usage} for t in tools]})


def instantiate_tools(tools: Sequence[str | BaseTool], settings: ToolSettings) -> list[BaseTool]:
    """Tool names (looked up with :func:`discover_tools`) or ready instances -> instances."""
    names = [t for t in tools if isinstance(t, str)]
    classes = discover_tools(names, settings.tool_dirs) if names else {}
    out = []
    for t in tools:
        out.append(classes[t](settings) if isinstance(t, str) else t)
    seen = set()
    for t in out:
        if t.name in seen:
            raise ValueError(f"tool {t.name!r} is listed twice in --tools")
        seen.add(t.name)
    return out


def create_app(tools: Sequence[str | BaseTool], settings: Optional[ToolSettings] = None
               ) -> web.Application:
    """The aiohttp application serving ``tools`` (names in routing order, or instances)."""
    settings = settings or ToolSettings()
    dispatcher = Dispatcher(instantiate_tools(tools, settings), settings)
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[DISPATCHER_KEY] = dispatcher
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
