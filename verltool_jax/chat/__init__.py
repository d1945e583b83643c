"""Chat-template rendering with tool schemas, and the native tool-call parsers, shared by
the gateway (an agent program's requests) and our agent loop (``rollout.tool_format``)."""

from .render import ToolChat, check_template, render_messages
from .tool_parsers import FORMATS, parse_tool_calls, parser_for_model, stop_strings

__all__ = [
    "FORMATS",
    "ToolChat",
    "check_template",
    "parse_tool_calls",
    "parser_for_model",
    "render_messages",
    "stop_strings",
]
