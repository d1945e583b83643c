"""A small MCP server for tests/test_mcp_tool.py (official SDK): stdio by default,
``--http PORT`` for Streamable HTTP."""

import asyncio
import base64
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

app = MCPServer("verltool-test", log_level="CRITICAL")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def fail(message: str) -> str:
    """Always raises."""
    raise ValueError(message)


@app.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "slept"


@app.tool()
def red_pixel() -> Image:
    """A 1x1 red PNG."""
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
    )
    return Image(data=png, format="png")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
