"""Sampler fixtures (a pytest plugin, re-exported by tests/conftest.py).

One vLLM CPU engine per test session: starting one takes ~15-60 s on two cores, so every
test (samplers, rollout, trainer) shares ``vllm_sampler``. ``get_vllm_sampler()`` is the
module-level cache behind it, usable from helpers too. Tests that change its weights
must sync the checkpoint's weights back before they finish (``restore_checkpoint_weights``).
"""

from __future__ import annotations

import atexit
import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SAMPLER_MAX_MODEL_LEN = 512
_CACHE: dict = {}


def sampler_ckpt():
    """The tiny qwen2 checkpoint (vocab 512, head_dim 64, perturbed weights) of the sampler tests."""
    from support.models import tiny_ckpt

    return tiny_ckpt("qwen2")


def get_vllm_sampler():
    """The session's shared VLLMSampler on ``sampler_ckpt()`` (fp32, max_model_len 512)."""
    if "vllm" not in _CACHE:
        from verltool_jax.samplers.vllm_sampler import VLLMSampler

        s = VLLMSampler(
            sampler_ckpt(),
            max_model_len=SAMPLER_MAX_MODEL_LEN,
            dtype="float32",
            request_timeout_s=300,
            max_restarts=3,
            name="vllm-test",
        )
        _CACHE["vllm"] = s
        atexit.register(s.close)
    return _CACHE["vllm"]


def restore_checkpoint_weights(sampler) -> None:
    """Sync the checkpoint's own weights back into ``sampler`` (version 0)."""
    from verltool_jax.models.safetensors_io import checkpoint_files, iter_tensors

    named = [nt for f in checkpoint_files(sampler_ckpt()) for nt in iter_tensors(f)]
    sampler.load_named_tensors(named, 0)


@pytest.fixture(scope="session")
def vllm_sampler():
    """A real vLLM CPU engine (VLLMSampler) shared by the whole session."""
    s = get_vllm_sampler()
    yield s
    _CACHE.pop("vllm", None)
    s.close()  # while pytest's output capture is still open


@pytest.fixture(scope="session")
def sampler_flax_model():
    """The Flax Transformer of ``sampler_ckpt()`` (fp32), the trainer side of parity tests."""
    from verltool_jax.models.hf_io import load_hf

    return load_hf(sampler_ckpt())


@pytest.fixture(scope="session")
def sampler_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(sampler_ckpt())
