"""The config machinery every section uses: field specs, their checks, and the
conversions between a section dataclass and an ``ml_collections.ConfigDict``.

A leaf: no project imports, so a package can declare its own config section (a frozen
dataclass) with :func:`spec` fields without importing :mod:`verltool_jax.run_config`.

One validation style:

* a field-local rule is metadata on the field: :func:`spec` with ``choices`` (a tuple, or
  a function returning the names a registry holds now, plugins included) or ``check`` =
  ``(predicate, "what the value must be")``; :class:`Checked` enforces them in
  ``__post_init__`` (``SECTION`` prefixes the message with the config section's name);
* a rule between fields is the section's own ``__post_init__``, after
  ``super().__post_init__()``;
* ``derived=True`` marks a field the run sets from another section: it is not in the
  config dict (``algo.temperature`` from ``rollout.temperature``).

:func:`build_section` reports every problem of a whole section (unknown keys, values
against their specs, then the cross-field rules) instead of stopping at the first.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, ClassVar

import ml_collections
from ml_collections import config_dict


class ConfigError(ValueError):
    """A config file, override or value is wrong; the message names the key and the fix."""


def spec(
    default: Any = dataclasses.MISSING,
    *,
    choices: tuple | Callable[[], Any] | None = None,
    check: tuple[Callable[[Any], bool], str] | None = None,
    default_factory: Any = dataclasses.MISSING,
    derived: bool = False,
) -> Any:
    """A dataclass field with validation metadata: ``choices`` (allowed values, or a
    function returning them when checked) or ``check`` = ``(predicate, "what the value
    must be")``; ``None`` is always allowed for an ``Optional`` field. ``derived``: not
    in the config dict (the run sets it)."""
    md = {"choices": choices, "check": check, "derived": derived}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=md)
    return field(default=default, metadata=md)


def at_least(bound: float, note: str = "") -> tuple:
    return (lambda v: v >= bound), f">= {bound}" + (f" ({note})" if note else "")


def above(bound: float) -> tuple:
    return (lambda v: v > bound), f"> {bound}"


def in_unit_interval() -> tuple:
    return (lambda v: 0 < v <= 1), "in (0, 1]"


def check_fields(cls: type, values: Mapping[str, Any], prefix: str) -> list[str]:
    """Problems of ``values`` (field name -> value) against the ``choices`` / ``check``
    metadata of dataclass ``cls``'s fields."""
    problems = []
    for f in dataclasses.fields(cls):
        v = values.get(f.name)
        if v is None:
            continue
        choices, check = f.metadata.get("choices"), f.metadata.get("check")
        if callable(choices):
            choices = tuple(choices())
        if choices is not None and v not in choices:
            problems.append(f"{prefix}{f.name}={v!r} must be one of {list(choices)}")
        if check is not None:
            ok, what = check
            try:
                good = bool(ok(v))
            except TypeError:
                good = False
            if not good:
                problems.append(f"{prefix}{f.name}={v!r} must be {what}")
    return problems


def _values(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


class Checked:
    """Mixin: ``__post_init__`` raises a ValueError listing every metadata violation,
    each named ``<SECTION>.<field>`` (just ``<field>`` when ``SECTION`` is empty)."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self) -> None:
        prefix = f"{self.SECTION}." if self.SECTION else ""
        problems = check_fields(type(self), _values(self), prefix)
        if problems:
            raise ValueError("; ".join(problems))


# ----------------------------------------------------------------------------- dict <-> typed
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _inner(tp: Any) -> Any:
    """``Optional[X]`` -> X; ``tuple[X, ...]`` -> tuple; else the type itself."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _inner(args[0]) if len(args) == 1 else Any
    if origin in (tuple, list):
        return tuple
    return tp


def config_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of section ``cls`` that appear in the config dict (not ``derived``)."""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("derived")]


def section_dict(obj: Any) -> ml_collections.ConfigDict:
    """A section dataclass instance as a ``ConfigDict`` (None -> a typed placeholder)."""
    hints = _hints(type(obj))
    c = ml_collections.ConfigDict()
    for f in config_fields(type(obj)):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            c[f.name] = section_dict(v)
        elif v is None:
            inner = _inner(hints[f.name])
            c[f.name] = config_dict.placeholder(inner if isinstance(inner, type) else object)
        else:
            c[f.name] = v
    return c


def _plain(v: Any) -> Any:
    if isinstance(v, ml_collections.ConfigDict):
        return v.to_dict()
    if isinstance(v, list):
        return tuple(v)
    return v


def build_section(cls: type, values: Mapping[str, Any], path: str, problems: list[str]) -> Any:
    """``cls(**values)`` with nested sections built recursively; unknown keys and every
    validation error are appended to ``problems`` (prefixed with the dotted ``path``)."""
    fields = {f.name: f for f in config_fields(cls)}
    kwargs: dict[str, Any] = {}
    for k in values.keys():
        if k not in fields:
            close = difflib.get_close_matches(k, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"{path}{k}: unknown key{hint} (known: {sorted(fields)})")
            continue
        v = values[k]
        sub = fields[k].default_factory
        if isinstance(v, (ml_collections.ConfigDict, dict)) and dataclasses.is_dataclass(sub):
            v = build_section(sub, v, f"{path}{k}.", problems)
            if v is None:
                return None
        kwargs[k] = _plain(v)
    n_before = len(problems)
    problems.extend(f"{path}{p}" for p in check_fields(cls, kwargs, ""))
    if len(problems) > n_before:
        return None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        problems.append(f"{path.rstrip('.') or cls.__name__}: {e}")
        return None
