"""Shared action parsing for tools (not a tool: files starting with ``_`` are skipped).

Several tools share the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` format
(image operations, file_editor, run_tests, ...). The router gives an action to the first
tool whose ``parse_action`` accepts it, so each tool must accept **only its own names**.
:func:`parse_tool_call_for` does exactly that, in one place:

* a well-formed call whose ``name`` is one of the tool's names -> a :class:`ToolCall`;
* a call the tool can recognise as meant for it but that is broken (invalid JSON with a
  recoverable ``"name"`` of the tool, a near-miss name such as ``"crop"`` for
  ``"crop_image"``, ``arguments`` that are not an object) -> a :class:`ToolCallError`
  whose ``message`` says exactly what is wrong (the tool turns it into an observation);
* anything else -> not accepted, so the router can try the next tool.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field

from tool_server.kit.tags import delimited_bodies

_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')


@dataclass(frozen=True)
class ToolCall:
    """A parsed ``<tool_call>``: the tool ``name`` and its ``arguments`` object."""

    name: str
    arguments: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    """A ``<tool_call>`` meant for this tool that cannot be run; ``message`` says why."""

    name: str | None
    message: str


ParsedToolCall = ToolCall | ToolCallError


def last_tool_call_body(action: str) -> str | None:
    """The text inside the last complete ``<tool_call>...</tool_call>`` of ``action``."""
    bodies = delimited_bodies(action or "", "<tool_call>", "</tool_call>")
    return bodies[-1].strip() if bodies else None


def _strip_code_fence(body: str) -> str:
    """Models sometimes wrap the JSON in a Markdown fence inside the tag; drop it
    (```` ```json ... ``` ```` or ```` ``` ... ``` ````; linear time)."""
    if len(body) < 6 or not (body.startswith("```") and body.endswith("```")):
        return body
    inner = body[3:-3]
    if inner.startswith("json"):
        inner = inner[4:]
    return inner.strip()


def decode_tool_call(body: str) -> ParsedToolCall:
    """Decode one tool-call body: ``{"name": str, "arguments": object | JSON string}``.

    ``arguments`` may be omitted (``{}``) or given as a JSON-encoded string (the OpenAI
    function-calling convention). Errors name the field and the fix.
    """
    body = _strip_code_fence(body)
    try:
        obj = json.loads(body)
    except RecursionError:
        return ToolCallError(
            None,
            "Invalid JSON in <tool_call>: nested too deeply. Write "
            '{"name": "<tool>", "arguments": {...}}.',
        )
    except json.JSONDecodeError as e:
        m = _NAME_RE.search(body)
        return ToolCallError(
            m.group(1) if m else None,
            f"Invalid JSON in <tool_call>: {e.msg} at line {e.lineno} column {e.colno}. "
            'Write {"name": "<tool>", "arguments": {...}} with double-quoted keys and strings.',
        )
    if not isinstance(obj, dict):
        return ToolCallError(
            None,
            "<tool_call> must contain a JSON object "
            '{"name": "<tool>", "arguments": {...}}, got '
            f"{type(obj).__name__}.",
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(None, '<tool_call> is missing the "name" field (a string).')
    args = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except RecursionError:
            return ToolCallError(name, f'"arguments" of {name} is nested too deeply.')
        except json.JSONDecodeError as e:
            return ToolCallError(
                name,
                f'"arguments" of {name} is a string that is not valid '
                f"JSON ({e.msg}); give an object instead.",
            )
    if not isinstance(args, dict):
        return ToolCallError(
            name, f'"arguments" of {name} must be a JSON object, got {type(args).__name__}.'
        )
    return ToolCall(name, args)


# Every name some tool claims through this module (filled by :func:`register_names` at import
# time), so that no tool claims another tool's exact name as its own "near miss".
_REGISTERED_NAMES: set[str] = set()


def register_names(names: Collection[str]) -> frozenset:
    """Record the ``<tool_call>`` names a tool owns; returns them as a frozenset."""
    _REGISTERED_NAMES.update(names)
    return frozenset(names)


def near_miss(name: str, names: Collection[str], cutoff: float = 0.75) -> str | None:
    """The tool name in ``names`` that ``name`` most plausibly misspells, if any.

    Never a name some registered tool owns exactly. A near miss has difflib similarity
    ratio >= ``cutoff``, or one name is a prefix of the other (``"crop"`` vs
    ``"crop_image"``, at least 3 characters).
    """
    low = name.lower()
    if name in _REGISTERED_NAMES or low in _REGISTERED_NAMES:
        return None
    for n in names:
        if len(low) >= 3 and (n.startswith(low) or low.startswith(n)):
            return n
    close = difflib.get_close_matches(low, list(names), n=1, cutoff=cutoff)
    return close[0] if close else None


def parse_tool_call_for(
    action: str, names: Collection[str], claim_near_misses: bool = True
) -> tuple[ParsedToolCall | None, bool]:
    """``parse_action`` for a ``<tool_call>`` tool whose tool names are ``names``.

    Uses the last complete ``<tool_call>`` of the action. Returns ``(ToolCall, True)`` for a
    call of one of ``names``; ``(ToolCallError, True)`` for a broken call that is recognisably
    meant for these names (see the module docstring); ``(None, False)`` otherwise.
    """
    body = last_tool_call_body(action)
    if body is None:
        return None, False
    parsed = decode_tool_call(body)
    if isinstance(parsed, ToolCall):
        if parsed.name in names:
            return parsed, True
        guess = near_miss(parsed.name, names) if claim_near_misses else None
        if guess is not None:
            return ToolCallError(
                parsed.name,
                f"Unknown tool name {parsed.name!r}; did you mean "
                f"{guess!r}? Available: {', '.join(sorted(names))}.",
            ), True
        return None, False
    if parsed.name is not None and (
        parsed.name in names or (claim_near_misses and near_miss(parsed.name, names) is not None)
    ):
        return parsed, True
    return None, False


def invalid_call(message: str) -> tuple[dict, bool, bool]:
    """``conduct_action``'s result for a call that cannot be run (a :class:`ToolCallError`,
    bad arguments, a failed operation): ``message`` is both the observation and the
    ``invalid_reason``; the trajectory is not done and the action is not valid."""
    return {"obs": message, "invalid_reason": message}, False, False
