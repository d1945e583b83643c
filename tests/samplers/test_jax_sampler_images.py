"""The JAX sampler refuses images with a clear error instead of silently dropping them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from verltool_jax.samplers.base import SamplerRequestError, SamplingParams
from verltool_jax.samplers.jax_sampler import JAXSampler


def test_text_only_model_refuses_images(sampler_flax_model):
    s = JAXSampler(sampler_flax_model, tokenizer=None, max_model_len=32, max_batch_size=1)
    try:
        img = np.zeros((8, 8, 3), np.uint8)
        with pytest.raises(SamplerRequestError, match="text-only and cannot take images"):
            asyncio.run(s.generate([5, 6, 7], SamplingParams(max_tokens=2), images=[img]))
        assert s.load == 0 and s.alive  # refused before queueing; the sampler lives on
    finally:
        s.close()
