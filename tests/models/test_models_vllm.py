"""save_hf output loads in vLLM (CPU) and scores prompts like our model does. Slow: starts vLLM."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
from support.models import tiny_ckpt

from verltool_jax.models.hf_io import load_hf, save_hf
from verltool_jax.models.logprobs import token_logprobs

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_vllm_loads_save_hf_and_agrees_on_prompt_logprobs(tmp_path):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    vllm = pytest.importorskip("vllm")
    model = load_hf(tiny_ckpt("qwen3"))
    out = save_hf(model, tmp_path / "ckpt")
    from support.models import tokenizer_dir
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tokenizer_dir()).save_pretrained(out)

    llm = vllm.LLM(
        model=str(out),
        dtype="float32",
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_model_len=256,
        seed=0,
    )
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 500, 16)]
    res = llm.generate(
        [{"prompt_token_ids": prompt}],
        vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
    )
    plp = res[0].prompt_logprobs  # [None, {token: Logprob}, ...]
    theirs = np.array([plp[i][prompt[i]].logprob for i in range(1, len(prompt))])

    ids = jnp.asarray([prompt])
    ours = np.asarray(token_logprobs(model, ids[:, :-1], jnp.ones_like(ids[:, :-1]), ids[:, 1:]))[0]
    np.testing.assert_allclose(theirs, ours, atol=2e-3)
    assert np.abs(ours).max() > 1.0  # not a trivially flat distribution
