"""A pool of two real vLLM CPU engines (slow: starts a second engine next to the shared one)."""

from __future__ import annotations

import asyncio

import pytest
from support.samplers import SAMPLER_MAX_MODEL_LEN, restore_checkpoint_weights, sampler_ckpt

from verltool_jax.samplers import SamplerPool, SamplingParams
from verltool_jax.samplers.parity import logprob_parity

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_pool_of_two_engines_routes_and_syncs_both(vllm_sampler, sampler_flax_model):
    import jax
    import numpy as np
    from flax import nnx

    from verltool_jax.samplers.vllm_sampler import VLLMSampler

    second = VLLMSampler(sampler_ckpt(), max_model_len=SAMPLER_MAX_MODEL_LEN, name="vllm-2")
    pool = SamplerPool([vllm_sampler, second])
    graphdef, orig = nnx.split(sampler_flax_model, nnx.Param)
    try:
        params = SamplingParams(max_tokens=6, temperature=0.9, seed=2)

        async def turns(k):
            return await asyncio.gather(
                *[
                    pool.generate([5 + i, 9, 17] + [30] * k, params, request_id=f"traj{i}")
                    for i in range(6)
                ]
            )

        first, second_turn = asyncio.run(turns(0)), asyncio.run(turns(2))
        idx = [c.metrics["sampler_index"] for c in first]
        assert sorted(set(idx)) == [0, 1]
        assert [c.metrics["sampler_index"] for c in second_turn] == idx
        rng = np.random.default_rng(3)
        new = jax.tree_util.tree_map(
            lambda x: x + rng.normal(0, 0.3, x.shape).astype(np.float32), orig
        )
        pool.update_weights(new, version=9)
        assert vllm_sampler.version == second.version == pool.version == 9
        prompts = [[5 + i, 9, 17] for i in range(6)]

        async def fresh():
            return await asyncio.gather(
                *[pool.generate(p, params, request_id=f"new{i}") for i, p in enumerate(prompts)]
            )

        comps = asyncio.run(fresh())
        assert {c.metrics["sampler_index"] for c in comps} == {0, 1}
        par = logprob_parity(nnx.merge(graphdef, new), list(zip(prompts, comps)), 0.9)
        assert par["mean_abs_diff"] < 1e-3, par  # both engines run the new weights
    finally:
        restore_checkpoint_weights(vllm_sampler)
        second.close()


def test_bf16_engine_syncs_in_place(sampler_flax_model):
    """A bfloat16 engine: a sync changes generation, syncing the original back restores it,
    and logprobs stay close to the fp32 trainer's (bf16 rounding only)."""
    import jax
    import numpy as np
    from flax import nnx

    from verltool_jax.samplers.vllm_sampler import VLLMSampler

    s = VLLMSampler(sampler_ckpt(), max_model_len=256, dtype="bfloat16", name="vllm-bf16")
    try:
        graphdef, orig = nnx.split(sampler_flax_model, nnx.Param)
        greedy = SamplingParams(max_tokens=8, temperature=0)
        prompts = [[5 + i, 9, 17] for i in range(4)]

        async def run(params):
            return await asyncio.gather(*[s.generate(p, params) for p in prompts])

        before = asyncio.run(run(greedy))
        rng = np.random.default_rng(5)
        new = jax.tree_util.tree_map(
            lambda x: x + rng.normal(0, 0.5, x.shape).astype(np.float32), orig
        )
        s.update_weights(new, version=1)
        assert s.last_sync["sync_bytes"] * 2 == sum(
            x.nbytes for x in jax.tree_util.tree_leaves(orig)
        )
        after = asyncio.run(run(greedy))
        assert [c.token_ids for c in after] != [c.token_ids for c in before]
        sampled = asyncio.run(run(SamplingParams(max_tokens=8, temperature=0.8, seed=0)))
        par = logprob_parity(nnx.merge(graphdef, new), list(zip(prompts, sampled)), 0.8)
        stale = logprob_parity(sampler_flax_model, list(zip(prompts, sampled)), 0.8)
        # bf16 weights and activations vs the fp32 trainer: close, and far closer to the
        # new weights than to the old ones
        assert par["mean_abs_diff"] < 0.3 and par["mean_abs_diff"] * 5 < stale["mean_abs_diff"], (
            par,
            stale,
        )
        s.update_weights(orig, version=2)
        assert [c.token_ids for c in asyncio.run(run(greedy))] == [c.token_ids for c in before]
    finally:
        s.close()
