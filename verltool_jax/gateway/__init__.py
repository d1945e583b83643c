"""An OpenAI-compatible gateway that records every call's tokens for training (docs/gateway.md)."""

from verltool_jax.chat import FORMATS, check_template, parse_tool_calls, parser_for_model

from .server import Gateway, GatewayConfig, GatewayThread

__all__ = [
    "FORMATS",
    "Gateway",
    "GatewayConfig",
    "GatewayThread",
    "check_template",
    "parse_tool_calls",
    "parser_for_model",
]
