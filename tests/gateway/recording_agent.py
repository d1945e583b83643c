"""An agent program for tests/gateway/test_gateway_trainer.py: two chat calls through the
official ``openai`` client with ``logprobs``, each reply's tokens and logprobs written
to a JSON-lines file, and a program reward. On rows of even index it rewrites its first
reply before the second call, so the gateway sees a break (a new sample)."""

from __future__ import annotations

import json

import openai

PROGRAM_REWARD = 0.25


async def two_calls(base_url: str, data: dict, log: str, max_tokens: int = 6) -> float:
    key = base_url.rstrip("/").split("/")[-2]  # .../t/<key>/v1
    rewrite = data["extra_info"]["index"] % 2 == 0
    messages = [dict(m) for m in data["prompt"]]
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as llm:
        for turn in range(2):
            out = await llm.chat.completions.create(
                model="policy", messages=messages, max_tokens=max_tokens, logprobs=True
            )
            choice = out.choices[0]
            assert choice.logprobs is not None and choice.logprobs.content is not None
            record = {
                "key": key,
                "turn": turn,
                "tokens": [c.token for c in choice.logprobs.content],
                "logprobs": [c.logprob for c in choice.logprobs.content],
                "completion_tokens": out.usage.completion_tokens if out.usage else -1,
                "version": out.system_fingerprint,
                "rewrote": rewrite and turn == 1,
            }
            with open(log, "a") as f:
                f.write(json.dumps(record) + "\n")
            content = "(rewritten)" if rewrite else (choice.message.content or "")
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": "Check it."},
            ]
    return PROGRAM_REWARD
