"""An OpenAI-compatible gateway that records every call's tokens for training (docs/gateway.md)."""

from .render import check_template
from .server import Gateway, GatewayConfig, GatewayThread
from .tool_parsers import FORMATS, parse_tool_calls, parser_for_model

__all__ = [
    "FORMATS",
    "Gateway",
    "GatewayConfig",
    "GatewayThread",
    "check_template",
    "parse_tool_calls",
    "parser_for_model",
]
