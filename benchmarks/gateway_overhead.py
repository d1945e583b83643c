"""Per-call overhead of the OpenAI gateway (verltool_jax/gateway) over calling the sampler
directly, on a multi-turn tool conversation.

Each call of an episode is timed twice: the sampler's own ``generate`` on the same prompt
ids (direct), and the same request through the official ``openai`` client, HTTP, the chat
template, the drift check and the recording (gateway). The sampler is ``constant`` (a
real Sampler that answers a fixed reply at once, so only the gateway is measured) or the
tiny ``jax`` model. Prints p50/p90 per call of both and of the server-side overhead
(time in ``Gateway.chat`` minus the sampler's).

    python benchmarks/gateway_overhead.py [--sampler constant|jax] [--episodes 30] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import openai

from verltool_jax.gateway import Gateway, GatewayConfig, GatewayThread
from verltool_jax.samplers.base import Completion, SamplingParams

REPLY = '<tool_call>\n{"name": "python_code", "arguments": {"code": "print(6*7)"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python_code",
            "description": "Run Python code in a sandbox.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]


class ConstantSampler:
    """A Sampler that answers ``REPLY`` + EOS at once (no model): the cost floor."""

    def __init__(self, tokenizer) -> None:
        self.version = 0
        self.ids = list(tokenizer.encode(REPLY, add_special_tokens=False)) + [
            tokenizer.eos_token_id
        ]
        self.eos_token_ids = [tokenizer.eos_token_id]

    async def generate(self, prompt_token_ids, params, request_id=None, *, images=None):
        return Completion(
            list(self.ids), [-0.1] * len(self.ids), "stop", policy_version=self.version
        )

    def update_weights(self, params, version: int) -> None:
        self.version = version

    def close(self) -> None:
        pass


class TimedSampler:
    """Wraps a sampler and keeps the wall time of each ``generate`` (server-side split)."""

    def __init__(self, inner) -> None:
        self.inner, self.version, self.times = inner, inner.version, []
        self.eos_token_ids = getattr(inner, "eos_token_ids", None)

    async def generate(self, prompt_token_ids, params, request_id=None, *, images=None):
        t0 = time.perf_counter()
        out = await self.inner.generate(prompt_token_ids, params, request_id)
        self.times.append(time.perf_counter() - t0)
        return out


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sampler", choices=("constant", "jax"), default="constant")
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    a = ap.parse_args()

    from verltool_jax.models.tiny import build_tokenizer

    tok_dir = tempfile.mkdtemp(prefix="gw_bench_tok_")
    tok = build_tokenizer(tok_dir)
    if a.sampler == "jax":
        from verltool_jax.models.tiny import build_tiny_hf
        from verltool_jax.samplers.jax_sampler import JAXSampler

        d = tempfile.mkdtemp(prefix="gw_bench_model_")
        build_tiny_hf(d, "qwen2", tokenizer_dir=tok_dir)
        inner = JAXSampler.from_pretrained(d, max_model_len=4096, max_batch_size=2)
    else:
        inner = ConstantSampler(tok)
    sampler = TimedSampler(inner)
    gt = GatewayThread(Gateway(sampler, tok, GatewayConfig(max_model_len=4096)))
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0)
    direct, via, server = [], [], []
    chat_times: list[float] = []
    gw = gt.gateway
    orig_chat = gw.chat

    async def timed_chat(key, body):
        t0 = time.perf_counter()
        out = await orig_chat(key, body)
        chat_times.append(time.perf_counter() - t0)
        return out

    gw.chat = timed_chat  # type: ignore[method-assign]
    for ep in range(a.episodes + 1):  # episode 0 warms up (compilation, connections)
        key = gt.open_episode()
        client = openai.OpenAI(base_url=gw.url(key), api_key="none", max_retries=0)
        msgs: list[dict] = [{"role": "user", "content": "What is 6*7? Use python. " * 20}]
        for _ in range(a.turns):
            t0 = time.perf_counter()
            r = client.chat.completions.create(
                model="policy", messages=msgs, tools=TOOLS, max_tokens=a.max_tokens, temperature=0
            )
            t_via = time.perf_counter() - t0
            prompt_len = r.usage.prompt_tokens
            ids = gw.episodes[key].samples[-1].ids[:prompt_len]
            t0 = time.perf_counter()
            gt.call(lambda ids=ids: inner.generate(ids, params))
            t_direct = time.perf_counter() - t0
            if ep:
                via.append(t_via)
                direct.append(t_direct)
                server.append(chat_times[-1] - sampler.times[-1])
            m = r.choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            for c in m.tool_calls or []:
                msgs.append({"role": "tool", "tool_call_id": c.id, "content": "42\n" * 10})
            if not m.tool_calls:
                msgs.append({"role": "user", "content": "Go on."})
        gt.call(lambda key=key: _end(gw, key))
    gt.close()
    ms = 1e3
    res = {
        "sampler": a.sampler,
        "calls": len(via),
        "direct_p50_ms": round(pct(direct, 50) * ms, 3),
        "gateway_p50_ms": round(pct(via, 50) * ms, 3),
        "overhead_p50_ms": round((pct(via, 50) - pct(direct, 50)) * ms, 3),
        "server_overhead_p50_ms": round(pct(server, 50) * ms, 3),
        "server_overhead_p90_ms": round(pct(server, 90) * ms, 3),
        "stats": dict(gw.stats),
    }
    print(json.dumps(res))


async def _end(gw: Gateway, key: str) -> None:
    gw.end(key)


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
