"""A LoRA run through the real trainer (tiny_math smoke config, JAX sampler): only the
adapters change, every sync after the first carries the adapters only (the default
``sampler.lora_sync="auto"`` is "adapter" for the JAX sampler) and the sampler's logprobs
match the trainer's, the SFT warm start trains adapters too, and the HF export is merged;
which vLLM engines start with LoRA layers."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from verltool_jax.cli import parse_command_line

REPO = Path(__file__).resolve().parents[2]


def test_lora_run_trains_adapters_and_syncs_them_alone(tmp_path):
    from flax import nnx

    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.train.trainer import train

    out = tmp_path / "run"
    argv = [
        "--config",
        str(REPO / "configs/tiny_math.py") + ":smoke",
        f"--config.trainer.out_dir={out}",
        "--config.logging.progress_bar=false",
        "--config.trainer.steps=2",
        "--config.sampler.backend=jax",
        "--config.rollout.mode=sync",
        "--config.model.lora_rank=4",
        "--config.model.lora_last_layers=1",
        "--config.optimizer.lr=1e-2",
        "--config.checkpoint.export_hf=true",
    ]
    res = train(parse_command_line(argv).config, echo=False)
    params = {k: np.asarray(v.get_value()) for k, v in nnx.to_flat_state(res.state.params)}
    lora = {k: v for k, v in params.items() if k[-1] in ("lora_a", "lora_b")}
    assert lora and all(k[1] == max(p[1] for p in lora) for k in lora)  # top layer only
    assert any(np.abs(v).max() > 0 for k, v in lora.items() if k[-1] == "lora_b")  # trained
    init = load_hf(out / "init_model")
    base = {k: np.asarray(v.get_value()) for k, v in nnx.to_flat_state(nnx.state(init, nnx.Param))}
    sft_steps = json.loads((out / "config.json").read_text())["sft"]["steps"]
    for k, v in base.items():  # frozen weights: bit-identical
        np.testing.assert_array_equal(params[k], v, err_msg=str(k))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["sync/logprob_diff_max"] for r in records if "sync/logprob_diff_max" in r]
    assert diffs and max(diffs) < 1e-3, diffs  # the sampler serves the trainer's policy
    adapter_only = [r["weight_sync/adapter_only"] for r in records if "weight_sync/bytes" in r]
    assert adapter_only and set(adapter_only) == {1.0}, adapter_only
    if sft_steps:
        assert any("sft/sft_loss" in r for r in records)
    merged = load_hf(out / "hf_model")  # export: plain HF weights, adapters folded
    ids = jax.numpy.asarray([[5, 9, 17, 3]])
    np.testing.assert_allclose(
        np.asarray(merged(ids)), np.asarray(res.state.model()(ids)), atol=1e-4, rtol=0
    )


def test_only_a_sampler_sent_adapters_starts_vllm_with_lora_layers(monkeypatch, tmp_path):
    """A training run's vLLM engine serves LoRA with ``sampler.lora_sync=adapter``; an
    evaluation's or a pass-rate measurement's (``adapters=False``: merged weights only), a
    run with ``lora_sync=merged`` and one with "auto" on CPU (merged there) start without
    LoRA layers. The engine constructor is replaced by one that records its arguments."""
    from verltool_jax.samplers import factory
    from verltool_jax.train import build

    seen = []
    monkeypatch.setattr(factory, "make_sampler", lambda path, backend, **kw: seen.append(kw))
    argv = ["--config", str(REPO / "configs/tiny_math.py") + ":smoke"]
    argv += ["--config.sampler.backend=vllm", "--config.model.lora_rank=4"]

    def rc(mode):
        return parse_command_line(argv + [f"--config.sampler.lora_sync={mode}"]).config

    build.make_sampler(rc("adapter"), tmp_path)
    build.make_sampler(rc("adapter"), tmp_path, adapters=False)
    build.make_sampler(rc("merged"), tmp_path)
    assert jax.default_backend() == "cpu"
    build.make_sampler(rc("auto"), tmp_path)
    assert [kw["lora_rank"] for kw in seen] == [4, 0, 0, 0]
    assert build.lora_sync_mode(rc("auto"))[0] == "merged"


def test_lora_sync_auto_is_merged_only_for_vllm_on_cpu():
    from verltool_jax.samplers.factory import choose_lora_sync

    def mode(req, backend, platform):
        return choose_lora_sync(req, backend=backend, platform=platform)[0]

    assert mode("auto", "vllm", "cpu") == "merged"
    assert mode("auto", "vllm", "gpu") == "adapter"
    assert mode("auto", "jax", "cpu") == "adapter"
    assert mode("adapter", "vllm", "cpu") == "adapter"
    assert mode("merged", "jax", "gpu") == "merged"
    with pytest.raises(ValueError, match="sampler.lora_sync must be one of"):
        mode("fused", "vllm", "cpu")
