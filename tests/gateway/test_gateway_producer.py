"""Rollout groups through the gateway (``verltool_jax/gateway/producer.py``): the example
agent program on the tiny JAX model fills the trainer's queue; a crashing program gives
an error record that the trainer drops, never a half-recorded trajectory."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

from support.rollout_fixtures import keyed_items

from verltool_jax.gateway import Gateway, GatewayConfig
from verltool_jax.gateway.producer import GatewayProducer
from verltool_jax.rollout.agent_loop import PromptItem
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.queue import TrajectoryQueue
from verltool_jax.train.health import trajectory_failed


def _example_agent():
    path = Path(__file__).parents[2] / "examples" / "openai_agent.py"
    spec = importlib.util.spec_from_file_location("openai_agent", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_agent_fills_the_queue_and_a_crash_is_an_error_record(
    sampler_flax_model, sampler_tokenizer, tool_url
):
    from verltool_jax.samplers.jax_sampler import JAXSampler

    agent = _example_agent()
    sampler = JAXSampler(
        sampler_flax_model, sampler_tokenizer, max_model_len=1024, max_batch_size=4
    )
    items = [
        PromptItem([], {"question": q, "answer": a}, f"g{i}")
        for i, (q, a) in enumerate([("1+1?", "2"), ("2+3?", "5")])
    ]

    def program(base_url, data):
        agent.run(base_url, tool_url, data["question"], max_tokens=6, max_turns=2)
        return 1.0 if data["answer"] == "2" else 0.0

    calls = {"n": 0}

    def crashing(base_url, data):
        calls["n"] += 1
        agent.run(base_url, tool_url, data["question"], max_tokens=4, max_turns=1)
        raise RuntimeError("the agent crashed after its first call")

    async def main():
        gw = Gateway(sampler, sampler_tokenizer, GatewayConfig(max_model_len=1024))
        await gw.start()
        try:
            queue = TrajectoryQueue(max_groups=4)
            prod = GatewayProducer(
                keyed_items(items),
                gateway=gw,
                agent=program,
                n_samples=2,
                cfg=RolloutConfig(),
                queue=queue,
            )
            groups = await prod.run()
            batch = await queue.get_batch(2)
            bad = GatewayProducer(
                keyed_items(items[:1]), gateway=gw, agent=crashing, n_samples=2, cfg=RolloutConfig()
            )
            bad_group = await bad._group(items[0])
            return groups, batch, bad_group, dict(gw.stats), len(gw.episodes)
        finally:
            await gw.stop()

    try:
        groups, batch, bad_group, stats, still_open = asyncio.run(main())
    finally:
        sampler.close()
    assert [len(g) for g in groups] == [2, 2] and len(batch) == 2
    for g, item in zip(groups, items):
        assert {t.group_id for t in g} == {item.group_id}
        for t in g:
            t.check()
            assert t.termination == "done" and not trajectory_failed(t) and sum(t.loss_mask) >= 1
            assert item.data["question"] in sampler_tokenizer.decode(t.prompt_ids)
            assert t.reward == (1.0 if item.group_id == "g0" else 0.0)
    assert calls["n"] == 2 and len(bad_group) == 2
    assert all(
        trajectory_failed(t) and t.response_ids == [] and "crashed" in t.error for t in bad_group
    )
    assert stats["agent_failed"] == 2 and still_open == 0
