"""Typed tool options (not a tool: ``_`` files are skipped).

Tool-specific options reach a tool through ``ToolSettings.extra`` (the server's
``--tool-opt key=value`` flag, so values may arrive as strings). :func:`tool_option`
converts them to the wanted type; when a key is absent it falls back to an environment
variable, then to the default. Bad values raise ``ValueError`` naming the option.
"""

from __future__ import annotations

import os
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(key: str, value: Any, typ: type) -> Any:
    if typ is bool:
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in _TRUE | _FALSE:
            return s in _TRUE
        raise ValueError(f"tool option {key!r} must be true or false, got {value!r}")
    if typ in (int, float):
        if isinstance(value, bool):
            raise ValueError(f"tool option {key!r} must be a number, got {value!r}")
        try:
            return typ(value)
        except (TypeError, ValueError):
            kind = "an integer" if typ is int else "a number"
            raise ValueError(
                f"tool option {key!r} must be {kind}, got {value!r} "
                f"(set it with --tool-opt {key}=<{typ.__name__}>)"
            ) from None
    if typ is str:
        return str(value)
    raise TypeError(f"unsupported option type {typ!r}")


def tool_option(
    extra: dict | None,
    key: str,
    typ: type,
    default: Any = None,
    env: str | None = None,
    minimum: float | None = None,
) -> Any:
    """``extra[key]``, else ``os.environ[env]``, else ``default``, converted to ``typ``."""
    if extra and key in extra and extra[key] is not None:
        value = extra[key]
    elif env and os.environ.get(env):
        value = os.environ[env]
    else:
        return default
    out = _convert(key, value, typ)
    if minimum is not None and out < minimum:
        raise ValueError(f"tool option {key!r} must be >= {minimum}, got {out!r}")
    return out
