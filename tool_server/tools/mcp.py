"""``mcp``: call the tools of a Model Context Protocol server (official ``mcp`` SDK).

Configure one MCP server per tool server with ``--tool-opt``:

* ``mcp_url=http://host:port/mcp`` - a Streamable HTTP server, or
* ``mcp_command="python my_server.py --flag"`` - a stdio server started once as a
  subprocess (split like a shell would; an operator-configured program, not model
  output, so it is not sandboxed);
* ``mcp_timeout_s`` - per call (default and at most 0.9 x the server's ``--timeout``);
* ``mcp_tools=a,b`` - only expose these tools of the MCP server (default: all).

At start-up the tool lists the MCP server's tools; an action
``<tool_call>{"name": "<one of them>", "arguments": {...}}</tool_call>`` calls it (near-miss
names get a "did you mean"). The observation is the result's text content (structured
content as JSON when there is no text), the first image as ``image`` (data URL), and
``metrics.is_error``; an error the MCP tool reports, an MCP protocol error or a timeout is
an observation with ``valid = false``. The connection is kept for the server's life and
reopened once if it dropped. MCP tools are stateless here: nothing is kept per trajectory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import sys
from typing import Any

from tool_server.kit.base import BaseTool, Observation
from tool_server.kit.options import tool_option
from tool_server.kit.shell import command_timeout
from tool_server.kit.tool_calls import ToolCallError, parse_tool_call_for, register_names

log = logging.getLogger("tool_server.mcp")


def mcp_target(extra: dict) -> Any:
    """The ``mcp.Client`` target from the options: a URL or ``StdioServerParameters``."""
    from mcp import StdioServerParameters

    url = tool_option(extra, "mcp_url", str, None, env="VERLTOOL_MCP_URL")
    command = tool_option(extra, "mcp_command", str, None, env="VERLTOOL_MCP_COMMAND")
    if bool(url) == bool(command):
        raise ValueError(
            "the mcp tool needs exactly one of --tool-opt mcp_url=http://.../mcp "
            "or --tool-opt mcp_command='python server.py'"
        )
    if url:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"tool option mcp_url must be an http(s) URL, got {url!r}")
        return url
    argv = shlex.split(command)
    if not argv:
        raise ValueError("tool option mcp_command is empty")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # the server's own interpreter (and its packages)
    return StdioServerParameters(command=argv[0], args=argv[1:])


def render_result(name: str, result: Any) -> tuple[dict, bool]:
    """``(observation, valid)`` for an MCP ``CallToolResult``."""
    texts, image = [], None
    for block in result.content or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind == "image" and image is None:
            image = f"data:{block.mime_type};base64,{block.data}"
        elif kind == "resource":
            res = block.resource
            texts.append(getattr(res, "text", None) or f"[resource {res.uri}]")
        elif kind == "resource_link":
            texts.append(f"[resource {block.uri}]")
    text = "\n".join(texts)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    obs: dict = {"obs": text, "metrics": {"is_error": bool(result.is_error)}}
    if image is not None:
        obs["image"] = image
    if result.is_error:
        obs["obs"] = f"Error from MCP tool {name}: {text}"
        obs["invalid_reason"] = "mcp_tool_error"
    return obs, not result.is_error


class _Connection:
    """An ``mcp.Client`` kept open by one background task (the SDK's task groups must be
    entered and left in the same task); calls are made from any task."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.client: Any | None = None  # the mcp.Client while connected
        self.tools: list = []
        self.error: BaseException | None = None
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    async def open(self, timeout_s: float) -> None:
        from mcp import Client

        ready = asyncio.Event()

        async def run() -> None:
            try:
                async with Client(self.target) as client:
                    self.tools = await self._list_tools(client)
                    self.client = client
                    ready.set()
                    await self._stop.wait()
            except BaseException as e:
                self.error = e
            finally:
                self.client = None
                ready.set()

        self._task = asyncio.create_task(run(), name="mcp-connection")
        try:
            await asyncio.wait_for(ready.wait(), timeout_s)
        except TimeoutError:
            await self.close()
            raise ConnectionError(
                f"could not connect to the MCP server within {timeout_s:g} s"
            ) from None
        if self.client is None:
            raise ConnectionError(f"could not connect to the MCP server: {self.error!r}")

    @staticmethod
    async def _list_tools(client: Any) -> list:
        out, cursor = [], None
        while True:
            res = await (client.list_tools(cursor=cursor) if cursor else client.list_tools())
            out.extend(res.tools)
            cursor = getattr(res, "next_cursor", None)
            if not cursor:
                return out

    @property
    def alive(self) -> bool:
        return self.client is not None and self._task is not None and not self._task.done()

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 10)
            except (TimeoutError, Exception):
                self._task.cancel()


class MCPTool(BaseTool):
    """The tools of one MCP server, called through ``<tool_call>``."""

    name = "mcp"
    usage = (
        '<tool_call>{"name": "<MCP tool>", "arguments": {...}}</tool_call> for the tools of '
        "the configured MCP server (listed at start-up)"
    )

    def __init__(self, settings=None) -> None:
        super().__init__(settings)
        self.tool_names: frozenset = frozenset()
        self._conn: _Connection | None = None
        self._reconnect = asyncio.Lock()

    async def astart(self) -> None:
        target = mcp_target(self.settings.extra)
        self._conn = _Connection(target)
        await self._conn.open(max(30.0, self.settings.timeout_s))
        names = {t.name for t in self._conn.tools}
        only = tool_option(self.settings.extra, "mcp_tools", str, "")
        if only:
            wanted = {n.strip() for n in only.split(",") if n.strip()}
            missing = wanted - names
            if missing:
                raise ValueError(
                    f"tool option mcp_tools names {sorted(missing)}, which the MCP "
                    f"server does not offer (it offers {sorted(names)})"
                )
            names = wanted
        self.tool_names = register_names(names)
        descr = "; ".join(
            f"{t.name}: {(t.description or '').strip().splitlines()[0][:80]}"
            if t.description
            else t.name
            for t in self._conn.tools
            if t.name in names
        )
        self.usage = f"{MCPTool.usage}. Tools: {descr}"
        log.info("mcp: %d tools: %s", len(names), sorted(names))

    def parse_action(self, action: str) -> tuple[Any, bool]:
        if not self.tool_names:
            return None, False
        return parse_tool_call_for(action, self.tool_names)

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        if isinstance(parsed, ToolCallError):
            return {"obs": parsed.message, "invalid_reason": parsed.message}, False, False
        from mcp.shared.exceptions import MCPError

        timeout = command_timeout(self.settings.extra, "mcp_timeout_s", self.settings.timeout_s)
        try:
            conn = await self._connection()
            assert conn.client is not None  # _connection gives a live connection
            result = await conn.client.call_tool(
                parsed.name, parsed.arguments, read_timeout_seconds=timeout
            )
        except MCPError as e:
            msg = f"MCP call {parsed.name} failed: {e}"
            if "timed out" in str(e):
                msg = f"MCP call {parsed.name} timed out after {timeout:g} s."
            return {"obs": msg, "invalid_reason": "mcp_error"}, False, False
        except (ConnectionError, OSError, RuntimeError) as e:
            if self._conn is not None and not self._conn.alive:
                log.warning("mcp connection lost: %r", e)
            msg = f"The MCP server is unavailable: {e}"
            return {"obs": msg, "invalid_reason": "mcp_unavailable"}, False, False
        obs, valid = render_result(parsed.name, result)
        return obs, False, valid

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.alive:
            return conn
        async with self._reconnect:
            if self._conn is None or not self._conn.alive:
                if self._conn is not None:
                    await self._conn.close()
                new = _Connection(
                    self._conn.target if self._conn else mcp_target(self.settings.extra)
                )
                self._conn = new
                await new.open(max(30.0, self.settings.timeout_s))
            return self._conn

    async def aclose(self) -> None:
        self.close()
        if self._conn is not None:
            await self._conn.close()
