"""Native tool calls in our agent loop (``rollout.tool_format`` = hermes | qwen3 | llama3).

The conversation of a trajectory is kept as an agent program would send it through the
gateway: the data row's messages, then per turn the assistant's raw reply and one
``tool`` message per call. It is rendered by the gateway's own code
(``chat.render.ToolChat``: the chat template with the tools' JSON schemas): the prompt
once, and after each turn's tool results the whole conversation with the next
generation prompt, of which only the tokens past the sequence so far are appended (loss
mask 0). ``chat.render.continuation`` decides how they join: ``extend`` (the new
rendering starts with the ids so far) or ``splice`` (it does so in text only: the
sampler's ids are kept and only the new text is tokenised). So a trajectory holds the
ids the gateway would record for the same conversation; history is never re-tokenised.
A template that rewrites earlier turns (``break``) ends the trajectory with an error
(the gateway would start a new training sample; the built-in loop keeps one sequence).

A reply is parsed with the format's parser (``chat.tool_parsers.parse_tool_calls``).
Each well-formed call of a served tool becomes the tool server's action through that
tool's ``BaseTool.action_from_call``; the calls of one reply (parallel calls, with
``rollout.stop_after_call=False``) run one after another and their results are rendered
together, in the order of the calls. A malformed call (bad JSON, no name, an unknown tool,
a missing argument) is answered with an ``Error: ...`` tool message without calling the
tool server, and counted in ``invalid_tool_calls``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from tool_server.registry import discover_tools
from verltool_jax.chat.render import ToolChat, continuation
from verltool_jax.chat.tool_parsers import new_call_id, parse_tool_calls
from verltool_jax.samplers.base import Completion


@functools.cache
def tool_class(name: str) -> Any:
    """The installed tool class named ``name`` (built-in, ``tool_server/tools``, or a
    plugin package), or None."""
    try:
        return discover_tools([name])[name]
    except Exception:  # unknown, or a plugin that cannot be imported here
        return None


def check_tools(chat: ToolChat) -> None:
    """Raise ValueError if a tool of ``chat`` has no class here to turn its calls into
    actions (``BaseTool.action_from_call``)."""
    missing = [n for n in chat.names if tool_class(n) is None]
    if missing:
        raise ValueError(
            f"rollout.tool_format={chat.fmt!r}: the tool server serves {missing}, which "
            "is not installed here, so its calls cannot become actions "
            "(BaseTool.action_from_call); install its package or use rollout.tool_format='tags'"
        )


@dataclass
class Call:
    """One call of a reply: the tool server's ``action``, or the ``error`` it is
    answered with instead; ``counted``: False for a call over ``rollout.max_turns``
    (answered, not run, not counted)."""

    id: str
    action: str | None = None
    error: str | None = None
    counted: bool = True


@dataclass
class NativeTurns:
    """The native-format state of one trajectory (module doc): its conversation, the
    text of its ids so far (for the splice check), and the calls of the current turn."""

    chat: ToolChat
    tokenizer: Any
    messages: list[dict]
    text: str = ""
    raw_replies: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    results: list[str] = field(default_factory=list)  # tool messages of this turn so far
    done: bool = False  # a result of this turn ended the episode

    @classmethod
    def start(
        cls, chat: ToolChat, tokenizer: Any, data: dict, prompt_ids: list[int], where: str
    ) -> NativeTurns:
        """The state at the prompt: ``data["prompt"]`` (the row's messages) rendered with
        the tools must be ``prompt_ids`` (the prompt pipeline renders it so)."""
        messages = data.get("prompt")
        if not isinstance(messages, list) or not messages:
            raise ValueError(
                f"{where}: rollout.tool_format={chat.fmt!r} renders the conversation from "
                "the data row's 'prompt' messages, and this row has none"
            )
        text, ids = chat.render(tokenizer, messages)
        if ids != list(prompt_ids):
            raise ValueError(
                f"{where}: prompt_ids are not the chat template's rendering of the row's "
                f"messages with the tools (rollout.tool_format={chat.fmt!r}); render the "
                "prompt with rollout.tool_chat() (the prompt pipeline's chat=)"
            )
        return cls(chat, tokenizer, [dict(m) for m in messages], text)

    def reply(self, comp: Completion, max_calls: int) -> list[Call]:
        """Record a sampled reply; its calls (empty: a final answer). At most
        ``max_calls`` are run, the others are answered as over the limit."""
        ids = list(comp.token_ids)
        self.text += self.tokenizer.decode(ids, skip_special_tokens=False)
        # the end-of-turn token is the template's, not the reply's (as in the gateway)
        at_eos = comp.finish_reason == "stop" and comp.stop_string is None
        if at_eos and ids and ids[-1] in set(self.tokenizer.all_special_ids):
            ids = ids[:-1]
        reply = self.tokenizer.decode(ids, skip_special_tokens=False)
        p = parse_tool_calls(reply, self.chat.fmt)
        self.calls, self.results, self.done = [], [], False
        if not p.calls:
            self.messages.append({"role": "assistant", "content": reply})
            self.raw_replies["content:" + reply] = reply
        else:
            entries = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in p.calls
            ]  # fmt: skip
            self.messages.append(
                {"role": "assistant", "content": p.content or None, "tool_calls": entries}
            )
            for pc in p.calls:
                self.raw_replies[pc.id] = reply
                self.calls.append(self._call(pc.id, pc.name, json.loads(pc.arguments)))
        self.calls += [Call(new_call_id(), error=e) for e in p.errors]
        for c in self.calls[max_calls:]:
            c.action, c.counted = None, False
            c.error = f"not run: at most {max_calls} more tool call(s) (rollout.max_turns)"
        return self.calls

    def _call(self, call_id: str, name: str, arguments: dict) -> Call:
        if name not in self.chat.names:
            return Call(
                call_id, error=f"unknown tool {name!r}; the tools are {list(self.chat.names)}"
            )
        try:
            return Call(call_id, action=tool_class(name).action_from_call(name, arguments))
        except ValueError as e:
            return Call(call_id, error=str(e))

    def answer(self, text: str) -> None:
        """The result of the next call of this turn."""
        self.results.append(text)

    @property
    def next_call(self) -> Call | None:
        """The first call of this turn without a result yet."""
        k = len(self.results)
        return self.calls[k] if k < len(self.calls) else None

    def tool_turn(self, prev_ids: list[int]) -> list[int] | None:
        """Every call answered: add the tool messages and render; the ids past
        ``prev_ids`` (the tool turn and the next generation prompt), or None if the
        template rewrote earlier turns."""
        for c, text in zip(self.calls, self.results):
            self.messages.append({"role": "tool", "tool_call_id": c.id, "content": text})
        text, ids = self.chat.render(self.tokenizer, self.messages, self.raw_replies)
        cont = continuation(prev_ids, self.text, ids, text, self.tokenizer)
        if cont.kind == "break":
            return None
        self.text = text
        self.calls, self.results = [], []
        return cont.prompt_ids[len(prev_ids) :]
