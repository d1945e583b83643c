"""GGUF (llama.cpp) import: ``load_gguf``, ``gguf_tokenizer``, ``export_gguf_to_hf``.

A GGUF file holds the architecture in key/value metadata (``general.architecture``,
``<arch>.block_count``, ``<arch>.attention.head_count``, ...), the tokenizer and chat
template (``tokenizer.ggml.*``, ``tokenizer.chat_template``) and the tensors, each under a
llama.cpp name (``blk.3.attn_q.weight``) in one of ggml's storage types (F32, F16, BF16 or a
block quantisation such as Q4_1: 32 weights share a scale and a minimum).

Reading one tensor: the ``gguf`` package memory-maps the file and dequantises a whole
tensor at once with numpy (``gguf.quants.dequantize``), giving float32 in the HF
``[out, in]`` layout. llama.cpp's converter permutes the rows of the Llama q and k
projections (per head, it interleaves the two rotary halves, because its Llama RoPE
rotates adjacent pairs where HF rotates the two halves); ``unpermute_qk`` undoes that.
Qwen2 / Qwen3 files are stored unpermuted (llama.cpp uses half-rotation RoPE for them).
The HF-named tensors then go through the same builder as ``load_hf``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig
from .hf_io import build_from_tensors, dtype_overrides, save_hf
from .transformer import Transformer

# GGUF general.architecture -> our model_type.
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# ggml storage types we dequantise (each covered by the tests).
SUPPORTED_TENSOR_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


class GGUFError(ValueError):
    """A GGUF file we cannot import; the message names the file and what is unsupported."""


def hf_tensor_name(gguf_name: str) -> str | None:
    """The HF name of a llama.cpp tensor name (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); None if it has none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Llama q/k row permutation.

    The converter maps HF row ``(head h, half j, index i)`` (``i < d = rows / n_head / 2``)
    to GGUF row ``(h, i, j)``: ``w.reshape(n_head, 2, d, ...).swapaxes(1, 2)``. This is
    the inverse, ``w.reshape(n_head, d, 2, ...).swapaxes(1, 2)``, for a weight ``[rows, in]``
    or a bias ``[rows]``; ``n_head`` is the query head count for q, the KV head count for k.
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise GGUFError(f"q/k projection with {rows} rows cannot hold {n_head} heads")
    d = rows // n_head // 2
    return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _reader(path: str | os.PathLike):
    import gguf

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no GGUF file at {p}")
    try:
        return gguf.GGUFReader(str(p))
    except Exception as e:  # the gguf package raises bare ValueError/struct errors
        raise GGUFError(f"{p}: not a readable GGUF file ({e})") from e


def _meta(reader) -> dict[str, Any]:
    """The scalar / string / small-array metadata (large token lists left out)."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.split(".")[-1] in (
            "tokens",
            "token_type",
            "merges",
            "scores",
        ):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # a field type this gguf version cannot decode: not one we read
            continue
    return out


def _architecture(meta: dict, path) -> str:
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise GGUFError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: "
            f"{sorted(GGUF_ARCHITECTURES)}"
        )
    return arch


def gguf_hf_config(meta: dict, tensor_names: set[str], path) -> dict:
    """An HF ``config.json`` dict from GGUF metadata (and which optional tensors exist)."""
    arch = _architecture(meta, path)

    def get(key, default=None, required=True):
        full = f"{arch}.{key}"
        if full in meta:
            return meta[full]
        if required and default is None:
            raise GGUFError(f"{path}: GGUF metadata lacks {full!r}")
        return default

    if "rope_freqs.weight" in tensor_names:
        raise GGUFError(
            f"{path}: per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 "
            "scaling) are not supported in GGUF import; use the HF checkpoint"
        )
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    scaling_type = get("rope.scaling.type", "none", required=False)
    rope: dict[str, Any] = {"rope_type": "default"}
    if scaling_type == "linear":
        rope = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif scaling_type not in ("none", None):
        raise GGUFError(
            f"{path}: GGUF rope.scaling.type {scaling_type!r} is not supported (none or linear)"
        )
    vocab = get("vocab_size", 0, required=False) or None
    d = {
        "model_type": GGUF_ARCHITECTURES[arch],
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads, required=False)),
        "head_dim": int(get("attention.key_length", hidden // heads, required=False)),
        "intermediate_size": int(get("feed_forward_length")),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0, required=False)),
        "rope_scaling": rope if rope["rope_type"] != "default" else None,
        "max_position_embeddings": int(get("context_length", 32768, required=False)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": arch == "llama" and "blk.0.attn_q.bias" in tensor_names,
        "hidden_act": "silu",
    }
    if vocab is not None:
        d["vocab_size"] = int(vocab)
    for ours, key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        v = meta.get(f"tokenizer.ggml.{key}")
        d[ours] = int(v) if v is not None else None
    return d


def _dequantize(t, path) -> np.ndarray:
    from gguf import quants

    kind = t.tensor_type.name
    if kind not in SUPPORTED_TENSOR_TYPES:
        raise GGUFError(
            f"{path}: tensor {t.name!r} has GGUF tensor type {kind}, which is not "
            f"supported; supported: {list(SUPPORTED_TENSOR_TYPES)}"
        )
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost first
    if kind in ("F32", "F16"):
        arr = np.asarray(t.data, dtype=np.float32)
    else:
        arr = quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
    return arr.reshape(shape)


def iter_hf_tensors(reader, hf_config: dict, path) -> Iterator[tuple[str, np.ndarray]]:
    """``(hf_name, float32 array)`` for every tensor of the file, dequantised one at a time,
    q/k rows unpermuted for Llama. An unknown tensor name is an error."""
    arch = hf_config["model_type"]
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None:
            raise GGUFError(f"{path}: GGUF tensor {t.name!r} has no place in a {arch} model")
        arr = _dequantize(t, path)
        if arch == "llama" and ".self_attn.q_proj." in name:
            arr = unpermute_qk(arr, hf_config["num_attention_heads"])
        elif arch == "llama" and ".self_attn.k_proj." in name:
            arr = unpermute_qk(arr, hf_config["num_key_value_heads"])
        yield name, arr


def load_gguf(
    path: str | os.PathLike,
    mesh=None,
    dtype: str | None = None,
    param_dtype: str | None = None,
    rules=None,
    **config_overrides,
) -> Transformer:
    """Load a Llama / Qwen2 / Qwen3 GGUF file as a ``Transformer`` (weights dequantised to
    float32, then cast to ``param_dtype``). Arguments as ``hf_io.load_hf``."""
    return _load(
        _reader(path), path, dtype_overrides(dtype, param_dtype, **config_overrides), mesh, rules
    )


def _load(reader, path, overrides: dict, mesh=None, rules=None) -> Transformer:
    hf = gguf_hf_config(_meta(reader), {t.name for t in reader.tensors}, path)
    if "vocab_size" not in hf:
        emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        if emb is None:
            raise GGUFError(f"{path}: GGUF file has no token_embd.weight")
        hf["vocab_size"] = int(emb.shape[1])
    cfg = ModelConfig.from_hf_dict(hf, **overrides)
    return build_from_tensors(
        cfg, iter_hf_tensors(reader, hf, path), str(path), mesh=mesh, rules=rules
    )


def has_tokenizer(path: str | os.PathLike, reader=None) -> bool:
    """Whether the file carries tokenizer metadata (``tokenizer.ggml.model``)."""
    return "tokenizer.ggml.model" in (reader or _reader(path)).fields


def gguf_tokenizer(path: str | os.PathLike, reader=None):
    """The file's tokenizer (vocabulary, merges, special tokens and chat template from
    ``tokenizer.*`` metadata) as a Hugging Face tokenizer, via transformers' GGUF
    conversion. ``reader``: an open ``gguf.GGUFReader`` of ``path`` (saves a re-parse)."""
    p = Path(path)
    reader = reader or _reader(p)
    if not has_tokenizer(p, reader):
        raise GGUFError(
            f"{p}: GGUF file has no tokenizer metadata (tokenizer.ggml.model); "
            "give the tokenizer separately (model.tokenizer_path)"
        )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    if not getattr(tok, "chat_template", None):
        template = _meta(reader).get("tokenizer.chat_template")
        if template:
            tok.chat_template = template
    return tok


def export_gguf_to_hf(
    path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "float32"
) -> Path:
    """Write a GGUF file as an HF checkpoint directory (config.json, safetensors in
    ``dtype``, generation_config.json, and the tokenizer when the file has one) that
    transformers, vLLM and ``load_hf`` read."""
    reader = _reader(path)
    model = _load(reader, path, dtype_overrides(dtype))
    tok = gguf_tokenizer(path, reader) if has_tokenizer(path, reader) else None
    return save_hf(model, out_dir, tokenizer=tok)
