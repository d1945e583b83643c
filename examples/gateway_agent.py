"""An agent program the trainer runs through the gateway (``rollout.producer="gateway"``):
native tool calls with the official ``openai`` client, our python tool through the tool
server's client, a loop until the model answers without a call. It knows nothing of
training; the trainer gives it a trajectory's ``base_url``, the data row and the tool
server's URL (``docs/gateway.md``)::

    --config.rollout.producer=gateway --config.gateway.agent=examples/gateway_agent.py:solve

``configs/tiny_math.py:gateway`` trains the tiny model with it. Returns None: the task's
verifier scores the answer (``gateway.reward``).
"""

from __future__ import annotations

import json
import uuid

import openai

from tool_server.client import ToolClient
from tool_server.tools.python_code import PythonCodeTool

TOOL = PythonCodeTool()


def tools() -> list[dict]:
    """The tool list sent with every call (the SFT demonstrations of the gateway variant
    of tiny_math render the same one)."""
    return [TOOL.function_schema()]


async def solve(
    base_url: str, data: dict, tool_url: str, max_turns: int = 2, max_tokens: int | None = None
) -> None:
    """Chat on the row's messages with ``tools()`` for up to ``max_turns`` calls
    (``max_tokens`` None: the gateway's default, the run's ``rollout.max_response_tokens``)."""
    limit = {} if max_tokens is None else {"max_tokens": max_tokens}
    messages: list[dict] = [dict(m) for m in data["prompt"]]
    tid = "agent-" + uuid.uuid4().hex[:12]
    async with (
        openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as llm,
        ToolClient(tool_url) as tool_server,
    ):
        try:
            for _ in range(max_turns):
                out = await llm.chat.completions.create(
                    model="policy", messages=messages, tools=tools(), **limit
                )  # type: ignore[call-overload]
                reply = out.choices[0].message
                messages.append(reply.model_dump(exclude_none=True))
                if not reply.tool_calls:
                    return None
                for call in reply.tool_calls:
                    try:
                        args = json.loads(call.function.arguments)
                        action = TOOL.action_from_call(call.function.name, args)
                        obs = (await tool_server.get_observation(tid, action)).observation
                    except (ValueError, KeyError) as e:  # the model's mistake, told to it
                        obs = f"Error: {e}"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": obs})
        finally:
            await tool_server.finish(tid)
    return None
