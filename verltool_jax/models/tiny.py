"""Tiny models and tokenizers built locally (nothing is downloaded).

``build_tokenizer`` trains a byte-level BPE tokenizer with the ``tokenizers`` library on
text we generate, with digits split one per token and a ChatML chat template;
``build_tiny_hf`` writes a random-initialised HF checkpoint (config.json +
safetensors + tokenizer) of the given family that transformers, vLLM and our Flax
loader all read. Used by tests, benchmarks and the tiny main job.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Frequent agent markup gets one token each, so tiny models learn the format quickly.
MARKUP_TOKENS = [
    "<python>",
    "</python>",
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "<sql>",
    "</sql>",
    "<tool_call>",
    "</tool_call>",
    "<result>",
    "</result>",
    "<information>",
    "</information>",
    "<think>",
    "</think>",
    "<bash>",
    "</bash>",
]
# Extra atomic markup for one run (``model.tiny.markup``): e.g. the JSON around a native
# tool call, so that ``<tool_call>`` is followed by one token, not ~35, before the code.
NATIVE_CALL_MARKUP = ('{"name": "python_code", "arguments": {"code": "', '"}}')
MARKUP_RULE = "distinct non-empty strings, none already a special or markup token"


def markup_ok(markup: Sequence[str]) -> bool:
    """Whether ``markup`` can be added to the tiny tokenizer (``MARKUP_RULE``)."""
    items = list(markup)
    return (
        all(isinstance(m, str) and m for m in items)
        and len(set(items)) == len(items)
        and not set(items) & set(SPECIAL_TOKENS + MARKUP_TOKENS)
    )


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

FAMILIES = ("qwen2", "qwen3", "llama")

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# ChatML where a message's content may also be a list of parts: {"type": "image"} becomes
# <|vision_start|><|image_pad|><|vision_end|> (as the Qwen2-VL template writes it), a text
# part its text.
CHATML_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """English-ish text, arithmetic, code and agent markup for tokenizer training."""
    rng = random.Random(seed)
    words = (
        "the a of to and in is was for on that with as by at from what which who "
        "compute product sum answer question result python print search sql select "
        "from where table count image crop zoom file bash test run output error value "
        "number multiply add subtract divide solve find name city country year"
    ).split()
    out = []
    for _i in range(n):
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        out.append(f"{sent.capitalize()}. What is {a} * {b}?")
        out.append(
            f"<python>print({a} * {b})</python><result>{a * b}</result><answer>{a * b}</answer>"
        )
        out.append(f"<search>{sent}</search> <sql>SELECT name FROM t WHERE id = {a};</sql>")
        out.append(f"def f(x):\n    return x + {b}\n\nprint(f({a}))  # {sent}")
    return out


def build_tokenizer(
    out_dir: str | os.PathLike,
    vocab_size: int = 512,
    corpus: Iterable[str] | None = None,
    model_max_length: int = 2048,
    extra_special_tokens: tuple[str, ...] = (),
    chat_template: str = CHATML_TEMPLATE,
    markup: Sequence[str] = (),
):
    """Train a byte-level BPE tokenizer and save it as a HF ``PreTrainedTokenizerFast``.

    Digits are split into single tokens; ``SPECIAL_TOKENS``, ``MARKUP_TOKENS`` and the
    extra ``markup`` are atomic (added tokens the BPE never splits; they decode to their
    text with ``skip_special_tokens=False``, as every decoder of ours and the vLLM
    sampler's detokenizer do). Corpus lines could not merge such markup: the byte-level
    pre-tokenizer cuts text at spaces and punctuation before BPE sees it. With no
    ``markup`` the tokenizer is the one every other run uses. Returns the loaded
    transformers tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not markup_ok(markup):
        raise ValueError(f"markup {list(markup)!r} must be {MARKUP_RULE} (model.tiny.markup)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + MARKUP_TOKENS + list(markup) + list(extra_special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(
        list(corpus) if corpus is not None else default_corpus(), trainer=trainer
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=model_max_length,
        additional_special_tokens=["<|im_start|>"] + list(extra_special_tokens),
    )
    fast.chat_template = chat_template
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def tiny_config_dict(
    family: str,
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    head_dim: int = 64,
    intermediate_size: int = 256,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    rope_theta: float = 10000.0,
) -> dict:
    """HF ``config.json`` fields of a tiny model of ``family`` (qwen2 | qwen3 | llama)."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=rope_theta,
        tie_word_embeddings=tie_word_embeddings,
        hidden_act="silu",
        initializer_range=0.02,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
        attention_dropout=0.0,
        use_cache=True,
    )
    if family == "qwen2":
        cfg.update(
            model_type="qwen2",
            architectures=["Qwen2ForCausalLM"],
            use_sliding_window=False,
            max_window_layers=num_layers,
        )
        if head_dim * num_heads != hidden_size:
            raise ValueError(
                "qwen2 derives head_dim = hidden_size / num_heads; "
                f"{hidden_size}/{num_heads} != {head_dim}"
            )
    elif family == "qwen3":
        cfg.update(
            model_type="qwen3",
            architectures=["Qwen3ForCausalLM"],
            head_dim=head_dim,
            attention_bias=False,
            use_sliding_window=False,
            max_window_layers=num_layers,
        )
    else:
        cfg.update(
            model_type="llama",
            architectures=["LlamaForCausalLM"],
            head_dim=head_dim,
            attention_bias=False,
            mlp_bias=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        )
    return cfg


def build_tiny_hf(
    out_dir: str | os.PathLike,
    family: str = "qwen2",
    vocab_size: int = 512,
    seed: int = 0,
    tokenizer_dir: str | os.PathLike | None = None,
    markup: Sequence[str] = (),
    **config_kwargs,
) -> Path:
    """Write a random-initialised tiny HF checkpoint (and tokenizer) to ``out_dir``.

    The tokenizer is trained here (with the extra atomic ``markup``, see
    :func:`build_tokenizer`) unless ``tokenizer_dir`` points at one to copy.
    Uses transformers (PyTorch) to initialise and save, so the files are exactly what
    the HF ecosystem produces.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        tok.save_pretrained(out)
    else:
        tok = build_tokenizer(out, vocab_size=vocab_size, markup=markup)
    vocab = max(vocab_size, len(tok))
    cfg_dict = tiny_config_dict(
        family, vocab, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **config_kwargs
    )
    with open(out / "config.json", "w") as f:
        json.dump(cfg_dict, f, indent=2)
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    with open(out / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}, f)
    return out


def mrope_sections(head_dim: int) -> tuple[int, int, int]:
    """M-RoPE sections (temporal, height, width) for ``head_dim``: its half split about
    1 : 1.5 : 1.5, as Qwen2.5-VL's 16 : 24 : 24 for head_dim 128."""
    half = head_dim // 2
    return (half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8)


def build_tiny_vl_hf(
    out_dir: str | os.PathLike,
    vocab_size: int = 512,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    mrope_section: tuple[int, int, int] = (2, 3, 3),
    vision_depth: int = 2,
    vision_hidden: int = 32,
    patch_size: int = 8,
    spatial_merge_size: int = 2,
    window_size: int = 32,
    max_position_embeddings: int = 2048,
    markup: Sequence[str] = (),
) -> Path:
    """A random-initialised tiny Qwen2.5-VL checkpoint (``Qwen2_5_VLForConditionalGeneration``)
    with its own BPE tokenizer, whose special tokens include ``VISION_TOKENS`` and whose chat
    template (``CHATML_VL_TEMPLATE``) writes image parts as the Qwen2-VL template does.
    ``mrope_section`` must sum to ``hidden_size / num_heads / 2``; vLLM's CPU attention
    needs a head size of 32 or more (``hidden_size=128, mrope_section=(4, 6, 6)``). The
    checkpoint holds the image processor's patch geometry. The last vision block
    attends over the whole image, the others over ``window_size``-pixel windows."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    head_dim = hidden_size // num_heads
    if sum(mrope_section) * 2 != head_dim:
        raise ValueError(
            f"mrope_section {mrope_section} must sum to head_dim / 2 = {head_dim // 2}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(
        out,
        vocab_size=vocab_size,
        corpus=corpus,
        extra_special_tokens=VISION_TOKENS,
        chat_template=CHATML_VL_TEMPLATE,
        markup=markup,
    )
    ids = {
        name: tok.convert_tokens_to_ids(t)
        for name, t in zip(
            ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"),
            VISION_TOKENS,
        )
    }
    vocab = max(vocab_size, len(tok))
    text = dict(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        rope_parameters=dict(
            rope_type="default", rope_theta=10000.0, mrope_section=list(mrope_section)
        ),
    )
    vision = dict(
        depth=vision_depth,
        hidden_size=vision_hidden,
        intermediate_size=2 * vision_hidden,
        num_heads=2,
        out_hidden_size=hidden_size,
        patch_size=patch_size,
        window_size=window_size,
        fullatt_block_indexes=[vision_depth - 1],
        spatial_merge_size=spatial_merge_size,
        temporal_patch_size=2,
    )
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **ids,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    # the image processor's patch geometry (what vLLM's processor reads to serve it)
    from transformers import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(
        patch_size=patch_size, temporal_patch_size=2, merge_size=spatial_merge_size
    ).save_pretrained(out)
    with open(out / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}, f)
    return out
