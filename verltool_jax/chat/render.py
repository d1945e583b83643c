"""OpenAI messages -> the model's chat template -> token ids, and the no-drift check.

Shared by the gateway (``verltool_jax/gateway``: an agent program's requests) and our own
agent loop with native tool calls (``rollout.tool_format``: the prompt, then each turn's
tool results), so both give the same tokens for the same conversation.

A request is rendered with ``tokenizer.apply_chat_template`` (``tools=`` when the template
knows tools; otherwise the tool list goes into the system message, in the Hermes style or
a compact one, ``TOOL_PROMPTS``). An assistant message the gateway itself produced is
rendered from the model's raw text (the exact reply, tool-call markup included), so
history is never re-rendered from the parsed fields.

``continuation`` decides how a turn joins the sequence so far (``prev_ids``: every prompt
and completion token of the current training sample, ``prev_text`` their text):

* ``"extend"``: the new prompt's ids start with ``prev_ids`` token for token;
* ``"splice"``: the ids differ (the sampler produced a non-canonical tokenisation, which
  a re-tokenisation would silently change) but the rendered text starts with
  ``prev_text``: the prompt becomes ``prev_ids`` + the ids of the new text only, so the
  sampled tokens are kept exactly;
* ``"break"``: neither (the template rewrote history, e.g. dropped earlier reasoning): the
  turn starts a new training sample with its own prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .tool_parsers import FORMATS, format_calls_as_text

TOOLS_SYSTEM_PROMPT = (
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def hermes_tool_prompt(tools: list[dict]) -> str:
    """The Hermes / Qwen2.5 tool block: every tool's full JSON schema (descriptions
    included) inside ``<tools>``, and how to write a call (``TOOLS_SYSTEM_PROMPT``)."""
    return TOOLS_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))


def compact_tool_prompt(tools: list[dict]) -> str:
    """A short tool block for small models with short contexts: one line naming each tool
    with its parameters (``name(param: type, ...)``, no descriptions) and the Hermes call
    syntax. About 60 tokens for python_code with the tiny tokenizer, against ~470 for
    :func:`hermes_tool_prompt` of ``python_code``; the calls are parsed the same way."""
    sigs = []
    for t in tools:
        fn = t.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        args = ", ".join(f"{k}: {(v or {}).get('type', 'any')}" for k, v in props.items())
        sigs.append(f"{fn.get('name')}({args})")
    return (
        "Tools: " + "; ".join(sigs) + "\nCall one as "
        '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
    )


# GatewayConfig.tool_prompt and rollout.tool_prompt: the tool block written into the
# system message when the chat template takes no ``tools=``
TOOL_PROMPTS = {"hermes": hermes_tool_prompt, "compact": compact_tool_prompt}
DEFAULT_TOOL_PROMPT = "hermes"


class RenderError(ValueError):
    """A request's messages cannot be rendered; the message names the field."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


def template_of(tokenizer: Any) -> str:
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):  # several named templates: the default one
        t = t.get("default") or next(iter(t.values()))
    if not t:
        raise RenderError(
            "the tokenizer has no chat template; give a tokenizer with one (tokenizer.chat_template)",
            "model",
        )
    return t


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RenderError(f"{where}.content[{i}]: only text parts are supported")
            out.append(str(part.get("text", "")))
        return "".join(out)
    raise RenderError(f"{where}.content must be a string or a list of text parts")


def normalize_messages(
    messages: Any,
    tools: list[dict] | None,
    *,
    raw_replies: dict[str, str],
    template: str,
    fmt: str,
    tool_prompt: str = DEFAULT_TOOL_PROMPT,
) -> list[dict]:
    """The messages as the template wants them (see module doc). ``raw_replies`` maps a
    tool-call id or a reply's content to the raw text the model wrote; ``tool_prompt``
    names the tool block (``TOOL_PROMPTS``) used when the template takes no ``tools=``."""
    if tool_prompt not in TOOL_PROMPTS:
        raise RenderError(
            f"tool_prompt {tool_prompt!r} is not one of {sorted(TOOL_PROMPTS)}", "tool_prompt"
        )
    if not isinstance(messages, list) or not messages:
        raise RenderError("'messages' must be a non-empty list of message objects")
    knows_tool_calls = "tool_calls" in template
    out: list[dict] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RenderError(f"{where} must be an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise RenderError(
                f"{where}.role {role!r} is not one of system, developer, user, assistant, tool"
            )
        text = _text_of(m.get("content"), where)
        if role == "developer":
            role = "system"
        if role == "assistant":
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise RenderError(f"{where}.tool_calls must be a list")
            raw = None
            for c in calls:
                raw = raw_replies.get(str((c or {}).get("id")))
                if raw is not None:
                    break
            if raw is None and not calls:
                raw = raw_replies.get("content:" + text)
            if raw is not None:
                out.append({"role": "assistant", "content": raw})
                continue
            if calls and knows_tool_calls:
                conv = []
                for j, c in enumerate(calls):
                    fn = (c or {}).get("function") or {}
                    args = fn.get("arguments", "{}")
                    try:
                        args = json.loads(args) if isinstance(args, str) else args
                    except json.JSONDecodeError:
                        raise RenderError(
                            f"{where}.tool_calls[{j}].function.arguments is not JSON"
                        ) from None
                    conv.append({**c, "function": {"name": fn.get("name"), "arguments": args}})
                out.append({"role": "assistant", "content": text, "tool_calls": conv})
            elif calls:
                body = format_calls_as_text(calls, fmt)
                out.append({"role": "assistant", "content": (text + "\n" + body).strip()})
            else:
                out.append({"role": "assistant", "content": text})
        elif role == "tool":
            out.append({"role": "tool", "content": text, "tool_call_id": m.get("tool_call_id")})
        else:
            out.append({"role": role, "content": text})
    if tools and "tools" not in template:  # the template ignores tools=: tell the model here
        block = TOOL_PROMPTS[tool_prompt](tools)
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def render(tokenizer: Any, messages: list[dict], tools: list[dict] | None) -> tuple[str, list[int]]:
    """(text, ids) of the normalised ``messages`` with the generation prompt."""
    template = template_of(tokenizer)
    kw: dict[str, Any] = {"tools": tools} if tools and "tools" in template else {}
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kw
        )
    except Exception as e:  # jinja errors: a message the template cannot take
        raise RenderError(f"the model's chat template cannot render these messages: {e}") from e
    return text, list(tokenizer.encode(text, add_special_tokens=False))


def render_messages(
    tokenizer: Any,
    messages: Any,
    tools: list[dict] | None,
    *,
    raw_replies: dict[str, str],
    fmt: str,
    tool_prompt: str = DEFAULT_TOOL_PROMPT,
    template: str | None = None,
) -> tuple[str, list[int]]:
    """(text, ids) of an OpenAI conversation with the generation prompt, as the gateway
    gives it to the sampler: :func:`normalize_messages`, then :func:`render`."""
    msgs = normalize_messages(
        messages, tools, raw_replies=raw_replies, template=template or template_of(tokenizer),
        fmt=fmt, tool_prompt=tool_prompt,
    )  # fmt: skip
    return render(tokenizer, msgs, tools)


@dataclass(frozen=True, eq=False)
class ToolChat:
    """How our agent loop renders a conversation with native tool calls
    (``rollout.tool_format``): the tools' OpenAI entries (``BaseTool.function_schema()``),
    the call format (``tool_parsers.FORMATS``) and the tool block when the template takes
    no ``tools=`` (``TOOL_PROMPTS``). :meth:`render` is the gateway's rendering."""

    tools: tuple[dict, ...]
    fmt: str = "hermes"
    tool_prompt: str = DEFAULT_TOOL_PROMPT

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"tool-call format {self.fmt!r} is not one of {FORMATS}")
        if self.tool_prompt not in TOOL_PROMPTS:
            raise ValueError(
                f"tool_prompt {self.tool_prompt!r} is not one of {sorted(TOOL_PROMPTS)}"
            )
        if not self.tools or not all(
            isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str)
            for t in self.tools
        ):
            raise ValueError(
                "native tool calls need the tools' schemas: a non-empty list of "
                "{type: function, function: {name, ...}} (BaseTool.function_schema())"
            )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    def render(
        self, tokenizer: Any, messages: Any, raw_replies: dict[str, str] | None = None
    ) -> tuple[str, list[int]]:
        """(text, ids) of ``messages`` (OpenAI form; an assistant message whose call id or
        content is in ``raw_replies`` is rendered from that raw text) with the tools."""
        return render_messages(
            tokenizer, messages, list(self.tools), raw_replies=raw_replies or {},
            fmt=self.fmt, tool_prompt=self.tool_prompt,
        )  # fmt: skip


@dataclass(frozen=True)
class Continuation:
    kind: str  # "extend" | "splice" | "break"
    prompt_ids: list[int]  # what the sampler is given


def continuation(
    prev_ids: Sequence[int], prev_text: str, ids: list[int], text: str, tokenizer: Any
) -> Continuation:
    """How the rendered (``text``, ``ids``) joins the sample so far (module doc)."""
    n = len(prev_ids)
    if n and len(ids) > n and ids[:n] == list(prev_ids):
        return Continuation("extend", ids)
    if n and prev_text and len(text) > len(prev_text) and text.startswith(prev_text):
        suffix = tokenizer.encode(text[len(prev_text) :], add_special_tokens=False)
        return Continuation("splice", list(prev_ids) + list(suffix))
    return Continuation("break", ids)


def check_template(tokenizer: Any, fmt: str = "hermes") -> dict:
    """The start-up check: render a two-turn conversation with a tool call and its result,
    and say whether the second prompt extends the first prompt + reply (``extend``), does
    so only in text (``splice``), or rewrites history (``break``: each turn becomes its
    own training sample)."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "python_code",
                "description": "Run Python code.",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string"}},
                    "required": ["code"],
                },
            },
        }
    ]
    template = template_of(tokenizer)
    reply = "<think>\nCompute it.\n</think>\n" if fmt == "qwen3" else ""
    if fmt == "llama3":
        reply += '{"name": "python_code", "parameters": {"code": "print(6*7)"}}'
    else:
        reply += '<tool_call>\n{"name": "python_code", "arguments": {"code": "print(6*7)"}}\n</tool_call>'
    raw = {"call_check": reply}
    m1 = [{"role": "user", "content": "What is 6*7? Use python."}]
    norm1 = normalize_messages(m1, tools, raw_replies=raw, template=template, fmt=fmt)
    text1, ids1 = render(tokenizer, norm1, tools)
    eos = getattr(tokenizer, "eos_token", None) or ""
    reply_ids = tokenizer.encode(reply, add_special_tokens=False)
    eos_ids = tokenizer.encode(eos, add_special_tokens=False) if eos else []
    fn = {"name": "python_code", "arguments": '{"code": "print(6*7)"}'}
    call: dict[str, Any] = {"id": "call_check", "type": "function", "function": fn}
    m2 = m1 + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_check", "content": "42"},
    ]
    norm2 = normalize_messages(m2, tools, raw_replies=raw, template=template, fmt=fmt)
    text2, ids2 = render(tokenizer, norm2, tools)
    prev_ids = ids1 + reply_ids + eos_ids
    c = continuation(prev_ids, text1 + reply + eos, ids2, text2, tokenizer)
    notes = {
        "extend": "the second prompt extends prompt + reply token for token: one sequence",
        "splice": "the second prompt extends prompt + reply in text only: the sampled ids are "
        "kept and only the new text is tokenised; one sequence",
        "break": "the template rewrites earlier turns: every turn after a rewrite starts a "
        "new training sample",
    }
    return {
        "case": c.kind,
        "note": notes[c.kind],
        "template_tools": "tools" in template,
        "template_tool_calls": "tool_calls" in template,
    }
