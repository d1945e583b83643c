"""Native tool calls in model text, per format: the text a model wrote -> OpenAI ``tool_calls``.

Formats (chosen by ``parser_for_model`` from the model name, or by config):

* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per
  call (Qwen2.5, SmolLM2, NousResearch Hermes); parallel calls are several blocks.
* ``qwen3``: Hermes blocks after an optional ``<think>...</think>`` that is returned as
  ``reasoning`` and never parsed for calls (Qwen3's template).
* ``llama3``: Llama-3.x JSON tool calls: the whole reply (after an optional
  ``<|python_tag|>``) is ``{"name": ..., "parameters": {...}}``, several separated by
  ``;`` for parallel calls.

A malformed call (bad JSON, no name, arguments not an object) is never an exception: it
becomes an entry of ``ParsedReply.errors`` whose message says what is wrong, so the caller
can answer it as an error observation, and it is not returned as a call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

FORMATS = ("hermes", "qwen3", "llama3")
# The text a call ends with, per format: our agent loop stops a turn there
# (``rollout.stop_after_call``). A Llama-3 call is the whole reply: it ends with the
# end-of-turn token, which the sampler stops on anyway.
CALL_STOPS: dict[str, tuple[str, ...]] = {
    "hermes": ("</tool_call>",),
    "qwen3": ("</tool_call>",),
    "llama3": (),
}
_HERMES_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THINK_RE = re.compile(r"^\s*<think>(.*?)</think>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    """One well-formed call: ``arguments`` is the JSON text of an object (OpenAI's shape)."""

    id: str
    name: str
    arguments: str


@dataclass
class ParsedReply:
    content: str  # the text outside the calls (stripped); "" if none
    calls: list[ParsedCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per malformed call
    reasoning: str | None = None


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parser_for_model(name: str) -> str:
    """The format of a model family by its name: ``llama`` -> ``llama3``, ``qwen3`` ->
    ``qwen3``, anything else (Qwen2.5, SmolLM2, Hermes) -> ``hermes``."""
    n = name.lower()
    if "llama" in n and "smol" not in n:
        return "llama3"
    if "qwen3" in n:
        return "qwen3"
    return "hermes"


def _call_from_obj(obj: object, args_key: str, where: str) -> ParsedCall | str:
    """A call from a decoded JSON value, or the message saying why it is not one."""
    if not isinstance(obj, dict):
        return f"{where}: expected a JSON object with 'name' and '{args_key}', got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f"{where}: the call has no 'name' string"
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return f"{where}: '{args_key}' of {name!r} is a string that is not JSON ({e.msg})"
    if not isinstance(args, dict):
        return f"{where}: '{args_key}' of {name!r} must be an object, got {type(args).__name__}"
    return ParsedCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))


def _parse_hermes(text: str) -> ParsedReply:
    calls: list[ParsedCall] = []
    errors: list[str] = []
    for k, m in enumerate(_HERMES_RE.finditer(text)):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"tool call {k + 1}: invalid JSON ({e.msg} at char {e.pos})")
            continue
        got = _call_from_obj(obj, "arguments", f"tool call {k + 1}")
        (errors.append(got) if isinstance(got, str) else calls.append(got))
    content = _HERMES_RE.sub("", text)
    if "<tool_call>" in content:  # an opened block never closed
        errors.append("tool call: '<tool_call>' without a closing '</tool_call>'")
        content = content[: content.index("<tool_call>")]
    return ParsedReply(content.strip(), calls, errors)


def _parse_llama3(text: str) -> ParsedReply:
    body = text.strip()
    tagged = body.startswith(_PYTHON_TAG)
    if tagged:
        body = body[len(_PYTHON_TAG) :].strip()
    if not body.startswith("{"):
        errs = ["tool call: <|python_tag|> not followed by a JSON object"] if tagged else []
        return ParsedReply(text.strip(), [], errs)
    calls: list[ParsedCall] = []
    errors: list[str] = []
    dec = json.JSONDecoder()
    i, k = 0, 0
    while i < len(body):
        k += 1
        try:
            obj, end = dec.raw_decode(body, i)
        except json.JSONDecodeError as e:
            errors.append(f"tool call {k}: invalid JSON ({e.msg} at char {e.pos})")
            break
        got = _call_from_obj(obj, "parameters", f"tool call {k}")
        (errors.append(got) if isinstance(got, str) else calls.append(got))
        i = end
        while i < len(body) and body[i] in " \t\r\n;":
            i += 1
    if not calls and not tagged and errors:
        return ParsedReply(text.strip(), [], errors)  # JSON-looking prose
    return ParsedReply("", calls, errors)


def stop_strings(fmt: str) -> tuple[str, ...]:
    """The stop strings that end a call in format ``fmt`` (``CALL_STOPS``)."""
    if fmt not in CALL_STOPS:
        raise ValueError(f"tool-call format {fmt!r} is not one of {FORMATS}")
    return CALL_STOPS[fmt]


def parse_tool_calls(text: str, fmt: str) -> ParsedReply:
    """Split a model reply into content, well-formed calls and errors (see module doc)."""
    if fmt == "hermes":
        return _parse_hermes(text)
    if fmt == "qwen3":
        m = _THINK_RE.match(text)
        reasoning = m.group(1).strip() if m else None
        out = _parse_hermes(text[m.end() :] if m else text)
        out.reasoning = reasoning
        return out
    if fmt == "llama3":
        return _parse_llama3(text)
    raise ValueError(f"tool-call format {fmt!r} is not one of {FORMATS}")


def format_calls_as_text(calls: list[dict], fmt: str) -> str:
    """OpenAI ``tool_calls`` written back in the model's own format (for assistant messages a
    client made up and a template that cannot render ``tool_calls``)."""
    parts = []
    for c in calls:
        fn = c.get("function") or {}
        args = fn.get("arguments") or "{}"
        obj = json.loads(args) if isinstance(args, str) else args
        if fmt == "llama3":
            parts.append(json.dumps({"name": fn.get("name"), "parameters": obj}))
        else:
            parts.append(
                "<tool_call>\n"
                + json.dumps({"name": fn.get("name"), "arguments": obj})
                + "\n</tool_call>"
            )
    return (";" if fmt == "llama3" else "\n").join(parts)
