"""Chat templating: messages -> prompt token ids, with the tokenizer's own template.

The prompt is rendered to text by ``tokenizer.apply_chat_template(messages,
add_generation_prompt=True, tokenize=False)`` and encoded without adding special tokens
again, so the ids are exactly what the template says (the sampler and trainer both use
these ids; nothing is re-tokenized later).
"""

from __future__ import annotations

from collections.abc import Sequence


def render_prompt(tokenizer, messages: Sequence[dict]) -> str:
    """The chat-templated prompt text, ending with the assistant turn's header."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat_template; set one (e.g. ChatML) or use "
            "a tokenizer saved with it"
        )
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_token_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of the chat-templated prompt (see the module doc)."""
    return encode_text(tokenizer, render_prompt(tokenizer, messages))
