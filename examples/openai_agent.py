"""An agent program that knows nothing of training: the official ``openai`` client, a
function-calling loop, and our python tool (run by the tool server). Point ``base_url`` at
a gateway trajectory (``Gateway.url(key)``, docs/gateway.md) and every call is recorded.

    python examples/openai_agent.py --base-url http://127.0.0.1:8000/t/KEY/v1 \
        --tool-server http://127.0.0.1:5000 "What is 6*7?"
"""

from __future__ import annotations

import argparse
import json
import uuid

import httpx
import openai

from tool_server.tools.python_code import PythonCodeTool

SYSTEM = "Solve the problem. Call python_code to compute; give the final answer in \\boxed{}."


def observe(tool_server: str, trajectory_id: str, action: str, finish: bool = False) -> str:
    body = {"trajectory_ids": [trajectory_id], "actions": [action], "finish": [finish]}
    out = httpx.post(f"{tool_server}/get_observation", json=body, timeout=60).json()
    obs = out["observations"][0]
    return obs["obs"] if isinstance(obs, dict) else str(obs)


def run(base_url: str, tool_server: str, question: str, api_key: str = "none",
        model: str = "policy", max_turns: int = 4, max_tokens: int = 256) -> str:  # fmt: skip
    """Chat until the model answers without a tool call (or ``max_turns``); the answer."""
    tool = PythonCodeTool()
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    tid = "agent-" + uuid.uuid4().hex[:12]
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    answer = ""
    try:
        for _ in range(max_turns):
            reply = client.chat.completions.create(
                model=model, messages=messages, tools=[tool.function_schema()], max_tokens=max_tokens
            ).choices[0].message  # fmt: skip
            messages.append(reply.model_dump(exclude_none=True))
            answer = reply.content or ""
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                try:
                    args = json.loads(call.function.arguments)
                    obs = observe(tool_server, tid, tool.action_from_call(call.function.name, args))
                except (ValueError, KeyError) as e:  # a bad call is the model's error, told to it
                    obs = f"Error: {e}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": obs})
    finally:
        httpx.post(f"{tool_server}/get_observation", timeout=60,
                   json={"trajectory_ids": [tid], "actions": [""], "finish": [True]})  # fmt: skip
    return answer


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("question")
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--tool-server", required=True)
    a = ap.parse_args()
    print(run(a.base_url, a.tool_server, a.question, api_key=a.api_key))
