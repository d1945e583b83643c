"""Request checks shared by every sampler backend.

A bad request fails here, before it reaches an engine, with a message that names the
field, the limit and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import SamplerRequestError, SamplingParams


def effective_max_tokens(
    prompt_token_ids: Sequence[int], params: SamplingParams, max_model_len: int, vocab_size: int
) -> int:
    """Validate one request and return the number of tokens it may generate.

    ``max_new = min(params.max_tokens, max_model_len - len(prompt))``: a completion that
    would run past the context is cut there (finish_reason "length"). A prompt of
    ``max_model_len`` tokens or more leaves no room and is an error, as are token ids and
    stop token ids outside ``[0, vocab_size)``.
    """
    if not isinstance(params, SamplingParams):
        raise SamplerRequestError(
            f"params must be verltool_jax.samplers.SamplingParams, got {type(params).__name__}"
        )
    n = len(prompt_token_ids)
    if n == 0:
        raise SamplerRequestError("prompt_token_ids is empty; pass at least one token id")
    if n >= max_model_len:
        raise SamplerRequestError(
            f"prompt of {n} tokens does not fit the sampler context max_model_len="
            f"{max_model_len} (it must leave room for >= 1 new token); shorten the prompt "
            f"(fewer turns / shorter observations) or start the sampler with a larger "
            f"max_model_len"
        )
    bad = [t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < vocab_size)]
    if bad:
        raise SamplerRequestError(
            f"prompt_token_ids holds ids outside [0, {vocab_size}) (the model vocabulary), "
            f"e.g. {bad[:3]}; prompts are token ids of this model's tokenizer"
        )
    bad_stop = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad_stop:
        raise SamplerRequestError(
            f"SamplingParams.stop_token_ids {bad_stop} are unknown to this model "
            f"(vocabulary size {vocab_size}); use ids of this model's tokenizer"
        )
    return min(params.max_tokens, max_model_len - n)


def check_image_request(
    name: str, config: Any, prompt_token_ids: Sequence[int], images: Sequence[Any]
) -> None:
    """Raise ``SamplerRequestError`` unless ``config`` (a ``models.ModelConfig``) is a
    vision-language model, every image is an ``ImageInput`` and the prompt holds one
    placeholder run of the image's length per image, in order."""
    if not getattr(config, "is_vision_language", False):
        from verltool_jax.models.transformer import text_only_error

        raise SamplerRequestError(f"{name}: {text_only_error(config)}")
    from verltool_jax.models.image_inputs import ImageInputError, check_placeholders

    bad = [type(im).__name__ for im in images if not hasattr(im, "pixel_values")]
    if bad:
        raise SamplerRequestError(
            f"{name}: images must be ImageInput (from "
            f"models.image_inputs.ImageProcessor), got {bad[:3]}"
        )
    try:
        check_placeholders(prompt_token_ids, images, config.image_token_id, f"{name} request")
    except ImageInputError as e:
        raise SamplerRequestError(str(e)) from None
