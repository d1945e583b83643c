"""The JAX sampler (continuous batching over models/decode.py) and its pure sampling ops."""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.samplers import sampler_ckpt

from verltool_jax.samplers import SamplerDeadError, SamplerRequestError, SamplingParams
from verltool_jax.samplers.parity import logprob_parity
from verltool_jax.samplers.sampling_ops import sample_tokens, truncate_logits

PROMPTS = [[3 + i, 40 + 7 * i, 100 + i, 200 + 3 * i, 17][: 2 + i % 4] for i in range(6)]


@pytest.fixture(scope="module")
def jax_sampler():
    from verltool_jax.samplers.jax_sampler import JAXSampler

    s = JAXSampler.from_pretrained(
        sampler_ckpt(), max_model_len=128, max_batch_size=8, name="jax-test"
    )
    yield s
    s.close()


def _gather(sampler, prompts, params):
    async def run():
        return await asyncio.gather(*[sampler.generate(p, params) for p in prompts])

    return asyncio.run(run())


# ------------------------------------------------------------------ pure sampling ops
def test_truncation_keeps_top_k_and_the_top_p_nucleus():
    z = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 3))
    out = truncate_logits(z, jnp.array([2, 0, 0]), jnp.array([1.0, 0.7, 0.81]))
    kept = np.isfinite(np.asarray(out))
    assert kept.tolist() == [
        [True, True, False, False],  # top-k 2
        [True, True, False, False],  # 0.5 < 0.7, 0.8 >= 0.7
        [True, True, True, False],
    ]  # 0.8 < 0.81 -> third kept


def test_sample_tokens_logprobs_at_T_and_renormalised_under_truncation():
    logits = jnp.array([[2.0, 1.0, 0.5, -1.0]] * 4)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    T = jnp.array([0.5, 0.5, 0.0, 0.5])
    tok, lp = sample_tokens(
        logits, T, jnp.array([0, 1, 0, 0]), jnp.array([1.0, 1.0, 1.0, 1e-6]), keys
    )
    tok, lp = np.asarray(tok), np.asarray(lp)
    ref_T = np.asarray(jax.nn.log_softmax(logits[0] / 0.5))
    assert lp[0] == pytest.approx(ref_T[tok[0]], abs=1e-6)  # log_softmax(l / T)
    assert tok[1] == 0 and lp[1] == pytest.approx(0.0, abs=1e-6)  # top-k 1: prob 1
    ref_1 = np.asarray(jax.nn.log_softmax(logits[2]))
    assert tok[2] == 0 and lp[2] == pytest.approx(ref_1[0], abs=1e-6)  # greedy: T taken as 1
    assert tok[3] == 0 and lp[3] == pytest.approx(0.0, abs=1e-6)  # tiny top-p: argmax only
    # frequencies follow softmax(l / T)
    n = 2000
    toks, _ = sample_tokens(
        jnp.tile(logits[:1], (n, 1)),
        jnp.full((n,), 0.5),
        jnp.zeros(n, jnp.int32),
        jnp.ones(n),
        jax.random.split(jax.random.PRNGKey(1), n),
    )
    freq = np.bincount(np.asarray(toks), minlength=4) / n
    assert np.abs(freq - np.exp(ref_T)).max() < 0.04


# ------------------------------------------------------------------ the sampler
def test_logprobs_match_the_trainer_at_T(jax_sampler, sampler_flax_model):
    T = 0.7
    comps = _gather(jax_sampler, PROMPTS, SamplingParams(max_tokens=10, temperature=T, seed=4))
    eos = jax_sampler.eos_token_ids
    assert eos  # from generation_config.json
    for c in comps:  # 10 tokens, or fewer ending in EOS
        assert len(c.token_ids) == len(c.logprobs) <= 10
        assert (c.finish_reason == "length" and len(c.token_ids) == 10) or (
            c.finish_reason == "stop" and c.token_ids[-1] in eos
        )
    par = logprob_parity(sampler_flax_model, list(zip(PROMPTS, comps)), T)
    assert par["mean_abs_diff"] < 1e-3, par
    assert par["num_tokens"] == sum(len(c.token_ids) for c in comps) >= 30
    again = _gather(jax_sampler, PROMPTS, SamplingParams(max_tokens=10, temperature=T, seed=4))
    assert [c.token_ids for c in again] == [c.token_ids for c in comps]  # seeded
    greedy = _gather(jax_sampler, PROMPTS[:3], SamplingParams(max_tokens=6, temperature=0))
    par1 = logprob_parity(sampler_flax_model, list(zip(PROMPTS[:3], greedy)), 1.0)
    assert par1["mean_abs_diff"] < 1e-3


def test_requests_join_a_running_batch(jax_sampler):
    """Continuous batching: short requests admitted while a long one runs finish first."""

    async def run():
        before = dict(jax_sampler.steps)
        long = asyncio.create_task(
            jax_sampler.generate(PROMPTS[0], SamplingParams(max_tokens=120, temperature=0))
        )  # greedy: no EOS here
        while jax_sampler.steps["decode"] < before["decode"] + 5:  # the long one is running
            await asyncio.sleep(0.001)
        shorts = [
            asyncio.create_task(
                jax_sampler.generate(p, SamplingParams(max_tokens=3, temperature=1.0, seed=2))
            )
            for p in PROMPTS[1:4]
        ]
        done_short = await asyncio.gather(*shorts)
        assert not long.done()
        c_long = await long
        return before, done_short, c_long

    before, shorts, c_long = asyncio.run(run())
    assert len(c_long.token_ids) == 120 and all(len(c.token_ids) == 3 for c in shorts)
    assert jax_sampler.steps["prefill"] - before["prefill"] >= 2  # admitted mid-flight
    assert jax_sampler.steps["decode"] - before["decode"] < 120 + 3 * 2  # decoded together


def test_stop_string_stop_id_and_length(jax_sampler):
    tok = jax_sampler.tokenizer
    free = asyncio.run(
        jax_sampler.generate(PROMPTS[2], SamplingParams(max_tokens=30, temperature=1.0, seed=3))
    )
    text = tok.decode(free.token_ids, skip_special_tokens=False)
    k = len(tok.decode(free.token_ids[:15], skip_special_tokens=False))
    stop = text[k - 2 : k]
    assert stop.strip() and stop not in text[: k - 2]
    c = asyncio.run(
        jax_sampler.generate(
            PROMPTS[2], SamplingParams(max_tokens=30, temperature=1.0, seed=3, stop=(stop,))
        )
    )
    assert c.finish_reason == "stop" and c.stop_string == stop
    assert c.token_ids == free.token_ids[: len(c.token_ids)] and len(c.token_ids) <= 15
    assert tok.decode(c.token_ids, skip_special_tokens=False).endswith(stop) or stop in tok.decode(
        c.token_ids[-2:], skip_special_tokens=False
    )
    j = next(i for i in range(3, 30) if free.token_ids[i] not in free.token_ids[:i])
    c2 = asyncio.run(
        jax_sampler.generate(
            PROMPTS[2],
            SamplingParams(
                max_tokens=30, temperature=1.0, seed=3, stop_token_ids=(free.token_ids[j],)
            ),
        )
    )
    assert c2.token_ids == free.token_ids[: j + 1] and c2.finish_reason == "stop"
    assert c2.metrics["stop_token_id"] == free.token_ids[j]
    assert free.finish_reason == "length" or free.token_ids[-1] in jax_sampler.eos_token_ids


def test_weight_swap_changes_and_restores_generation(jax_sampler, sampler_flax_model):
    from flax import nnx

    graphdef, orig = nnx.split(sampler_flax_model, nnx.Param)
    rng = np.random.default_rng(0)
    new = jax.tree_util.tree_map(lambda x: x + rng.normal(0, 0.5, x.shape).astype(np.float32), orig)
    greedy = SamplingParams(max_tokens=8, temperature=0)
    before = _gather(jax_sampler, PROMPTS, greedy)
    try:
        jax_sampler.update_weights(new, version=5)
        after = _gather(jax_sampler, PROMPTS, greedy)
        assert all(c.policy_version == 5 for c in after)
        assert [c.token_ids for c in after] != [c.token_ids for c in before]
        par = logprob_parity(nnx.merge(graphdef, new), list(zip(PROMPTS, after)), 1.0)
        assert par["mean_abs_diff"] < 1e-3
    finally:
        jax_sampler.update_weights(orig, version=0)
    assert [c.token_ids for c in _gather(jax_sampler, PROMPTS, greedy)] == [
        c.token_ids for c in before
    ]


def test_bad_requests_and_a_closed_sampler(jax_sampler, sampler_flax_model):
    with pytest.raises(SamplerRequestError, match="max_model_len=128"):
        asyncio.run(jax_sampler.generate([5] * 128, SamplingParams(max_tokens=2)))
    with pytest.raises(SamplerRequestError, match="stop_token_ids"):
        asyncio.run(jax_sampler.generate([5], SamplingParams(stop_token_ids=(99999,))))
    from verltool_jax.samplers.jax_sampler import JAXSampler

    bare = JAXSampler(sampler_flax_model, tokenizer=None, max_model_len=64, max_batch_size=2)
    with pytest.raises(SamplerRequestError, match="tokenizer"):
        asyncio.run(bare.generate([5, 6], SamplingParams(stop=("x",))))
    bare.close()
    with pytest.raises(SamplerDeadError, match="closed"):
        asyncio.run(bare.generate([5, 6], SamplingParams(max_tokens=2)))
