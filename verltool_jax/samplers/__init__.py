"""Samplers: token ids in, sampled token ids + logprobs at temperature T out.

Backends import lazily (vLLM and JAX are heavy and optional): use
``verltool_jax.samplers.vllm_sampler.VLLMSampler`` and
``verltool_jax.samplers.jax_sampler.JAXSampler``; ``factory.make_sampler`` picks one.
"""

from .base import (
    Completion,
    Sampler,
    SamplerDeadError,
    SamplerError,
    SamplerRequestError,
    SamplerTimeoutError,
    SamplingParams,
)
from .pool import SamplerPool
from .routing import StickyLeastLoadedRouter

__all__ = [
    "Completion",
    "Sampler",
    "SamplerDeadError",
    "SamplerError",
    "SamplerRequestError",
    "SamplerTimeoutError",
    "SamplingParams",
    "SamplerPool",
    "StickyLeastLoadedRouter",
]
