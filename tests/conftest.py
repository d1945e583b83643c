"""Shared session fixtures. Areas keep theirs in tests/conftest_<area>.py; append only here."""

# --- samplers (issue 6): one shared vLLM CPU engine for the whole session -------------
from conftest_samplers import (sampler_flax_model, sampler_tokenizer,  # noqa: F401,E402
                               vllm_sampler)
