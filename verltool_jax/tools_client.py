"""The tool server's client lives in :mod:`tool_server.client`, beside the protocol it
speaks; this name stays for ``train/trainer.py`` (and the README) until they import it
from there."""

from tool_server.client import (
    ToolClient,
    ToolResult,
    ToolServerError,
    http_healthy,
    parse_observation,
    parse_tool_urls,
)

__all__ = [
    "ToolClient",
    "ToolResult",
    "ToolServerError",
    "http_healthy",
    "parse_observation",
    "parse_tool_urls",
]
