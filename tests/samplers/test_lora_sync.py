"""Adapter-only LoRA sync (``sampler.lora_sync="adapter"``): the samplers get the base once
and then only the adapters, and sample exactly what the trainer's unmerged LoRA forward
computes (the parity tolerance of the other sampler tests, 1e-3 mean |diff|)."""

from __future__ import annotations

import asyncio
import json

import jax
import numpy as np
import pytest
from flax import nnx
from support.samplers import SAMPLER_MAX_MODEL_LEN, sampler_ckpt

from verltool_jax import metric_names as names
from verltool_jax.models.hf_io import load_hf
from verltool_jax.models.lora import AdapterWeights, fold_lora, strip_lora, with_lora
from verltool_jax.models.safetensors_io import iter_tensors
from verltool_jax.samplers import SamplingParams
from verltool_jax.samplers.parity import logprob_parity
from verltool_jax.samplers.vllm_sampler import lora_engine_args
from verltool_jax.train.policy_version import PolicyPublisher

PROMPTS = [[1, 5, 9, 20, 33], [7, 8, 100, 4], [3, 3, 3, 200, 11, 19], [40, 2]]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_model(rank: int = 8, seed: int = 0, base_noise: float = 0.0):
    """The sampler checkpoint's model with rank-``rank`` adapters on every target of its
    last layer, B random (so the adapters change the function); ``base_noise`` perturbs
    the base kernels too (a base the engine does not have yet)."""
    m = with_lora(load_hf(sampler_ckpt()), rank=rank, alpha=2.0 * rank, last_layers=1)
    for i, (path, v) in enumerate(nnx.to_flat_state(nnx.state(m, nnx.Param))):
        if path[-1] == "lora_b":  # adapters by seed, the base perturbed alike for every seed
            k = jax.random.fold_in(jax.random.PRNGKey(seed), i)
            v.set_value(jax.random.normal(k, v.shape) * 0.3)
        elif path[-1] == "kernel" and base_noise:
            k = jax.random.fold_in(jax.random.PRNGKey(1000), i)
            v.set_value(v.get_value() + jax.random.normal(k, v.shape) * base_noise)
    return m


def adapters(m) -> AdapterWeights:
    return AdapterWeights(nnx.state(m, nnx.Param), m.config)


def sample(sampler, T: float = 1.0, max_tokens: int = 16):
    async def run():
        return await asyncio.gather(
            *[
                sampler.generate(p, SamplingParams(max_tokens=max_tokens, temperature=T, seed=i))
                for i, p in enumerate(PROMPTS)
            ]
        )

    return list(zip(PROMPTS, asyncio.run(run())))


def test_adapter_weights_export_as_a_peft_checkpoint(tmp_path):
    m = lora_model()
    aw = adapters(m)
    named = dict(aw.peft_tensors())
    last = m.config.num_layers - 1
    assert len(named) == 2 * len(TARGETS)
    q = f"base_model.model.model.layers.{last}.self_attn.q_proj"
    a = np.asarray(m.layers[last].attn.q_proj.lora_a[...])  # [in, r]
    b = np.asarray(m.layers[last].attn.q_proj.lora_b[...])  # [r, out]
    np.testing.assert_array_equal(named[f"{q}.lora_A.weight"], a.T)
    np.testing.assert_array_equal(named[f"{q}.lora_B.weight"], b.T)
    nbytes = aw.save_peft(tmp_path / "adapter")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["peft_type"]) == (8, 16.0, "LORA")
    written = dict(iter_tensors(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert written.keys() == named.keys()
    assert nbytes == sum(v.nbytes for v in written.values())
    assert not list((tmp_path / "adapter").glob(".*.tmp"))
    # the merged view and the base: what a merged sync and the first adapter sync send
    flat = lambda s: {k for k, _ in nnx.to_flat_state(s)}
    assert flat(aw.base()) == flat(aw.merged()) == flat(strip_lora(aw.params))
    assert not any(k[-1].startswith("lora") for k in flat(aw.base()))
    # a pytree: a device put or gather keeps the config
    moved = jax.tree.map(lambda x: x, aw)
    assert isinstance(moved, AdapterWeights) and moved.config is aw.config


def test_engine_args_pick_the_smallest_vllm_rank_that_holds_the_adapter():
    assert lora_engine_args(16)["max_lora_rank"] == 16
    assert lora_engine_args(12)["max_lora_rank"] == 16
    assert lora_engine_args(2)["max_lora_rank"] == 8
    assert lora_engine_args(4)["max_loras"] == 1
    with pytest.raises(ValueError, match="lora_sync='merged'"):
        lora_engine_args(1024)


def test_jax_sampler_applies_the_adapters_and_the_publisher_chooses_the_form():
    from verltool_jax.samplers.jax_sampler import JAXSampler

    s = JAXSampler.from_pretrained(
        sampler_ckpt(), max_model_len=128, max_batch_size=8, name="jax-lora"
    )
    try:
        m = lora_model(base_noise=0.02)
        pub = PolicyPublisher(s, lora_sync="adapter")
        pub.publish_now(adapters(m), 1)
        assert s.last_sync["sync_path"] == "adapter"
        assert pub.sync_metrics()[names.SYNC_ADAPTER_ONLY] == 1.0
        got = sample(s)
        assert logprob_parity(m, got, 1.0)["mean_abs_diff"] < 1e-3
        # not the base model: the adapters are in the function sampled
        assert logprob_parity(load_hf(sampler_ckpt()), got, 1.0)["mean_abs_diff"] > 1e-2
        # merged: the publisher folds them, the sampler swaps a plain state in
        merged = PolicyPublisher(s, lora_sync="merged")
        merged.publish_now(adapters(m), 2)
        assert s.last_sync["sync_path"] == "swap"
        assert merged.sync_metrics()[names.SYNC_ADAPTER_ONLY] == 0.0
        assert logprob_parity(m, sample(s), 1.0)["mean_abs_diff"] < 1e-3
    finally:
        s.close()


@pytest.fixture(scope="module")
def lora_vllm():
    """A vLLM CPU engine serving LoRA (its own: the session's engine has no LoRA layers)."""
    from verltool_jax.samplers.vllm_sampler import VLLMSampler

    s = VLLMSampler(
        sampler_ckpt(),
        max_model_len=SAMPLER_MAX_MODEL_LEN,
        dtype="float32",
        request_timeout_s=300,
        name="vllm-lora",
        lora_rank=8,
    )
    yield s
    s.close()


def test_vllm_serves_the_adapters_in_place_with_trainer_parity(lora_vllm):
    s = lora_vllm
    m = lora_model(base_noise=0.02)  # the base differs from the engine's checkpoint
    s.update_weights(adapters(m), 1)
    assert s.last_sync["sync_path"] == "adapter" and s.version == 1
    nbytes = sum(a.nbytes for _, a in adapters(m).peft_tensors())
    assert s.last_sync["sync_bytes"] == nbytes  # the adapters, not the model
    for T in (1.0, 0.7):
        par = logprob_parity(m, sample(s, T), T)
        assert par["mean_abs_diff"] < 1e-3, par
    # later syncs replace the one adapter in place: new values served, nothing piles up
    base_load = s._base_load
    for v in range(2, 5):
        m = lora_model(seed=v, base_noise=0.02)  # the same base, new adapters
        s.update_weights(adapters(m), v)
        assert s.last_sync["engine_adapters"] == 1 and s.version == v
        assert s._base_load is base_load  # the base went once
        par = logprob_parity(m, sample(s), 1.0)
        assert par["mean_abs_diff"] < 1e-3, par
    # merged weights (an evaluation's) turn the adapter off: no double application
    merged = fold_lora(nnx.state(m, nnx.Param), m.config.lora_scale)
    s.update_weights(merged, 5)
    # into the LoRA-wrapped layers' base_layer, in place (not vLLM's slow reload)
    assert s.last_sync["sync_path"] == "inplace", s.last_sync
    par = logprob_parity(m, sample(s), 1.0)
    assert par["mean_abs_diff"] < 1e-3, par


def test_an_engine_without_lora_layers_merges_and_skips_the_frozen_base(vllm_sampler):
    """The merged default on CPU: the publisher hands ``AdapterWeights`` to an engine that
    merges them itself; after the first sync only the adapted kernels of the last layer
    are sent, the rest spot-checked as frozen (not compared in full), and the engine
    samples the trainer's LoRA model."""
    from support.samplers import restore_checkpoint_weights

    s = vllm_sampler
    assert s.merges_adapters
    pub = PolicyPublisher(s, lora_sync="merged")
    try:
        m = lora_model(seed=1)
        pub.publish_now(adapters(m), 1)
        assert s.last_sync["sync_path"] == "inplace"
        m = lora_model(seed=2)  # new adapters, the same base
        pub.publish_now(adapters(m), 2)
        last = s.last_sync
        frozen = adapters(m).frozen_hf_names()
        layer = f"model.layers.{m.config.num_layers - 1}."
        assert not any(n.startswith(layer) and n.endswith("proj.weight") for n in frozen)
        sent = set(json_names(s._shm.full_manifest)) - set(s._shm.skipped)
        assert sent == {
            layer + p
            for p in ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight")
            + ("mlp.gate_up_proj.weight", "mlp.down_proj.weight")
        }, sent
        assert last["trusted_tensors"] == last["skipped_tensors"] > 0
        assert 0 < last["written_bytes"] < last["sync_bytes"]
        par = logprob_parity(m, sample(s), 1.0)
        assert par["mean_abs_diff"] < 1e-3, par
    finally:
        restore_checkpoint_weights(s)


def json_names(manifest: str) -> list[str]:
    return [row[0] for bucket in json.loads(manifest) for row in bucket["tensors"]]
