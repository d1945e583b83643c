"""Dotted command-line overrides (``rollout.max_turns=3``) applied with type checks.

The type of a value is the type of the field it replaces (or of its placeholder):
``int``, ``float`` (ints accepted), ``bool`` (true/false/1/0/yes/no), ``str``, and
``tuple``/``list`` (a Python literal ``(1, 2)`` / ``['a', 'b']`` or a comma-separated
``a,b``; items take the type of the default's items). An unknown key or a value that
does not parse is a :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

from verltool_jax.cli.config_loader import ConfigError

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _literal(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def _parse_scalar(key: str, raw: str, typ: type) -> Any:
    if typ is bool:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"--config.{key}={raw!r}: expected a bool (true/false)")
    if typ is int:
        try:
            return int(raw.strip().replace("_", ""))
        except ValueError:
            raise ConfigError(f"--config.{key}={raw!r}: expected an int") from None
    if typ is float:
        try:
            return float(raw.strip())
        except ValueError:
            raise ConfigError(f"--config.{key}={raw!r}: expected a float") from None
    if typ is str:
        return raw
    raise ConfigError(
        f"--config.{key}: fields of type {typ.__name__} cannot be set from the command line"
    )


def _coerce_item(key: str, x: Any, item_type: type) -> Any:
    if isinstance(x, str):
        return _parse_scalar(key, x, item_type)
    if item_type is float and isinstance(x, int) and not isinstance(x, bool):
        return float(x)
    if type(x) is not item_type:
        raise ConfigError(f"--config.{key}={x!r}: expected a {item_type.__name__}")
    return x


def _parse_sequence(key: str, raw: str, typ: type, default: Any) -> Any:
    text = raw.strip()
    if text[:1] in "([" and text[-1:] in ")]":
        try:
            items = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ConfigError(
                f"--config.{key}={raw!r}: not a valid {typ.__name__} literal; "
                "write e.g. (1, 2) or a,b"
            ) from None
        if not isinstance(items, (tuple, list)):
            items = (items,)
    elif text == "":
        items = ()
    else:
        items = [s.strip() for s in text.split(",") if s.strip() != ""]
    item_types = {type(x) for x in (default or ())}
    if len(item_types) == 1:
        (item_type,) = item_types
        items = [_coerce_item(f"{key}[{i}]", x, item_type) for i, x in enumerate(items)]
    else:  # no (or mixed) default items: literals where they parse, else strings
        items = [_literal(x) if isinstance(x, str) else x for x in items]
    return typ(items)


def parse_value(key: str, raw: str, typ: type, default: Any = None) -> Any:
    """Parse the command-line text ``raw`` of field ``key`` as type ``typ``."""
    if typ in (tuple, list):
        return _parse_sequence(key, raw, typ, default)
    if typ is type(None):  # a field defaulting to None without a placeholder type
        return None if raw.strip().lower() in ("none", "null") else _literal(raw)
    return _parse_scalar(key, raw, typ)


def _child(config: ml_collections.ConfigDict, part: str, key: str) -> Any:
    if part not in config:
        close = difflib.get_close_matches(part, list(config.keys()), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"--config.{key}: unknown key {part!r}{hint} (known here: {sorted(config.keys())})"
        )
    return config[part]


def apply_override(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
    """Set the dotted ``key`` of ``config`` from text ``raw``, checking key and type."""
    parts = key.split(".")
    if not key or any(p == "" for p in parts):
        raise ConfigError(f"--config.{key}: malformed key; write --config.section.field=value")
    node = config
    for depth, part in enumerate(parts[:-1]):
        node = _child(node, part, key)
        if not isinstance(node, ml_collections.ConfigDict):
            raise ConfigError(
                f"--config.{key}: {'.'.join(parts[: depth + 1])!r} is a value, not a section"
            )
    leaf = parts[-1]
    current = _child(node, leaf, key)
    if isinstance(current, ml_collections.ConfigDict):
        raise ConfigError(
            f"--config.{key} is a section; set one of its fields, e.g. "
            f"--config.{key}.{sorted(current.keys())[0]}=..."
        )
    typ = node.get_type(leaf)
    value = parse_value(key, raw, typ, current)
    try:
        with node.ignore_type() if typ is type(None) else _null():
            setattr(node, leaf, value)
    except (TypeError, AttributeError) as e:
        raise ConfigError(f"--config.{key}={raw!r}: {e}") from None


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: Mapping[str, str] | Iterable[tuple[str, str]]
) -> ml_collections.ConfigDict:
    """Apply ``{dotted_key: text}`` overrides in order (in place; returns ``config``)."""
    items = overrides.items() if isinstance(overrides, Mapping) else overrides
    for key, raw in items:
        apply_override(config, key, str(raw))
    return config
