"""Partial rollouts in the samplers: a weight sync stops the requests in flight at their
current token and continues them from their prefixes with the new weights.

Checked against the trainer: every token's logprob equals the Flax model's under the
weights of the version the token is labelled with (the old version's before the cut, the
new one's after), which a wrong label or a continuation over stale KV would break.
"""

from __future__ import annotations

import asyncio
import threading
import time

import jax
import numpy as np
import pytest
from support.samplers import restore_checkpoint_weights, sampler_ckpt

from verltool_jax.samplers import SamplingParams
from verltool_jax.samplers.parity import token_parity
from verltool_jax.samplers.stops import stop_across_boundaries

PROMPTS = [[3, 40, 100], [4, 47, 101, 203], [5, 54], [6, 61, 102, 209, 17]]


def perturbed(model, scale=0.05, seed=0):
    from flax import nnx

    graphdef, orig = nnx.split(model, nnx.Param)
    rng = np.random.default_rng(seed)
    new = jax.tree_util.tree_map(
        lambda x: x + rng.normal(0, scale, x.shape).astype(np.float32), orig
    )
    return graphdef, orig, new


def parity_by_version(graphdef, params_of, samples):
    """``{version: token_parity}`` of the sampled tokens, each scored by the params of the
    version it is labelled with (``params_of[version]``)."""
    from flax import nnx

    seqs = [list(p) + list(c.token_ids) for p, c in samples]
    ids = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
    mask = np.zeros(ids.shape, np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    out = {}
    for v, params in params_of.items():
        picks = [
            (i, len(p) - 1 + j, lp)
            for i, (p, c) in enumerate(samples)
            for j, (lp, tv) in enumerate(zip(c.logprobs, c.versions()))
            if tv == v
        ]
        out[v] = token_parity(nnx.merge(graphdef, params), ids, mask, picks, 1.0)
    return out


def check_continued(comps, v0, v1, params_of, graphdef, n_tokens=None):
    """Every completion: versions are v0 then v1 (a single cut, or none); at least one
    was cut; every token's logprob is its version's."""
    cut = 0
    for c in comps:
        vs = c.versions()
        assert len(vs) == len(c.token_ids) == len(c.logprobs) > 0
        k = vs.count(v0)
        assert vs == [v0] * k + [v1] * (len(vs) - k), vs
        assert c.policy_version == vs[0]
        cut += 0 < k < len(vs)
        if n_tokens is not None:
            assert len(c.token_ids) == n_tokens  # the budget is the request's, not per part
    assert cut >= 1, "no request was in flight at the sync; the test saw no continuation"
    par = parity_by_version(graphdef, params_of, list(zip(PROMPTS, comps)))
    for v in (v0, v1):
        assert par[v] and par[v]["max_abs_diff"] < 2e-3, par


# ------------------------------------------------------------------ the JAX sampler
@pytest.fixture(scope="module")
def jax_partial():
    from verltool_jax.samplers.jax_sampler import JAXSampler

    s = JAXSampler.from_pretrained(
        sampler_ckpt(),
        max_model_len=256,
        max_batch_size=4,
        eos_token_ids=[],  # every request runs to its budget
        name="jax-partial",
        partial_rollouts=True,
    )
    yield s
    s.close()


def _sync_mid_flight(sampler, params, version, wait_steps, n=60, seed=None):
    """Generate PROMPTS (n tokens each); sync ``params`` as ``version`` once the sampler has
    run ``wait_steps`` decode steps; return the completions."""

    async def run():
        p = [SamplingParams(max_tokens=n, temperature=1.0, seed=seed) for _ in PROMPTS]
        task = asyncio.gather(*(sampler.generate(x, q) for x, q in zip(PROMPTS, p)))
        start = sampler.steps["decode"]
        while sampler.steps["decode"] - start < wait_steps:
            await asyncio.sleep(0.005)
        sampler.update_weights(params, version)
        return await task

    return asyncio.run(run())


def test_jax_sampler_continues_rows_from_their_prefixes(jax_partial, sampler_flax_model):
    graphdef, orig, new = perturbed(sampler_flax_model)
    try:
        comps = _sync_mid_flight(jax_partial, new, 7, wait_steps=10)
        check_continued(comps, 0, 7, {0: orig, 7: new}, graphdef, n_tokens=60)
    finally:
        jax_partial.update_weights(orig, 0)


def test_jax_sampler_off_keeps_todays_labels(sampler_flax_model):
    """Off (the default): a row in flight goes on, labelled with the version it started on."""
    from verltool_jax.samplers.jax_sampler import JAXSampler

    s = JAXSampler(sampler_flax_model, max_model_len=256, max_batch_size=4, eos_token_ids=[])
    try:
        assert s.partial_rollouts is False
        _, orig, new = perturbed(sampler_flax_model)
        comps = _sync_mid_flight(s, new, 7, wait_steps=10)
        assert all(c.token_versions is None and c.versions() == [0] * 60 for c in comps)
    finally:
        s.close()


# ------------------------------------------------------------------ vLLM
def test_vllm_sampler_aborts_and_resumes_from_token_ids(vllm_sampler, sampler_flax_model):
    graphdef, orig, new = perturbed(sampler_flax_model)
    v0 = vllm_sampler.version
    vllm_sampler.partial_rollouts = True

    async def run():
        p = SamplingParams(max_tokens=400, temperature=1.0)
        task = asyncio.ensure_future(
            asyncio.gather(*(vllm_sampler.generate(x, p) for x in PROMPTS))
        )
        await asyncio.sleep(0.5)
        t = threading.Thread(target=vllm_sampler.update_weights, args=(new, 21))
        t.start()
        while t.is_alive():
            await asyncio.sleep(0.05)
        return await asyncio.wait_for(task, 300)

    try:
        t0 = time.perf_counter()
        comps = asyncio.run(run())
        assert vllm_sampler.version == 21 and time.perf_counter() - t0 < 300
        assert any(c.metrics.get("partial_cuts") == 1 for c in comps)
        check_continued(comps, v0, 21, {v0: orig, 21: new}, graphdef)
    finally:
        vllm_sampler.partial_rollouts = False
        restore_checkpoint_weights(vllm_sampler)


def test_vllm_drained_sync_waits_for_the_requests_in_flight(vllm_sampler, sampler_flax_model):
    """``drain_at_sync`` (the partial-rollout experiment's baseline): the sync returns only
    once every request in flight has finished, each wholly on the old weights."""
    graphdef, orig, new = perturbed(sampler_flax_model)
    v0 = vllm_sampler.version
    vllm_sampler.drain_at_sync = True

    async def run():
        p = SamplingParams(max_tokens=400, temperature=1.0)
        finished: list[float] = []

        async def one(x):
            c = await vllm_sampler.generate(x, p)
            finished.append(time.perf_counter())
            return c

        task = asyncio.ensure_future(asyncio.gather(*(one(x) for x in PROMPTS)))
        await asyncio.sleep(0.5)
        began = time.perf_counter()
        t = threading.Thread(target=vllm_sampler.update_weights, args=(new, 23))
        t.start()
        while t.is_alive():
            await asyncio.sleep(0.05)
        return await asyncio.wait_for(task, 300), finished, began

    try:
        comps, finished, began = asyncio.run(run())
        assert vllm_sampler.version == 23
        assert any(f > began for f in finished), "no request was in flight at the sync"
        # every token was sampled by the old weights (with the default "keep", the tokens
        # after the sync come from the new ones and this parity fails)
        for c in comps:
            assert c.versions() == [v0] * len(c.token_ids) and c.token_versions is None
        par = parity_by_version(graphdef, {v0: orig}, list(zip(PROMPTS, comps)))
        assert par[v0] and par[v0]["max_abs_diff"] < 2e-3, par
    finally:
        vllm_sampler.drain_at_sync = False
        restore_checkpoint_weights(vllm_sampler)


# ------------------------------------------------------------------ stop strings at a cut
def test_a_stop_string_straddling_a_cut_ends_the_completion_there():
    chars = "ab</py>cd"  # one character per token id
    decode = lambda ids: "".join(chars[i] for i in ids)
    ids = list(range(len(chars)))
    # cut after "ab</p": the continuation completes "</py>" at token 6 ('>')
    assert stop_across_boundaries(ids, [4], ("</py>",), decode) == (6, "</py>")
    # a cut before the stop string began: the engine saw it whole, nothing to do here
    assert stop_across_boundaries(ids, [2], ("</py>",), decode) is None
    # a stop string wholly before the cut was the engine's to find
    assert stop_across_boundaries(ids, [8], ("</py>",), decode) is None
    assert stop_across_boundaries(ids, [4], (), decode) is None
    # the earliest of several
    assert stop_across_boundaries(ids, [3], ("b</py", "</p"), decode) == (4, "</p")
