"""Small synthetic GGUF files for the import tests, written with ``gguf.GGUFWriter``.

Random HF-layout weights (every row a whole number of 256-weight K-quant blocks; head_dim
128, the Qwen3 default transformers assumes), stored the way llama.cpp's converter stores
them: llama.cpp tensor names, Llama q/k rows permuted, each tensor in the ggml type the
test asks for. Q8_0 /
Q4_x / Q5_x / BF16 are quantised with ``gguf.quants.quantize``; the K types (which the
python package cannot quantise) get random blocks with sane float16 scales.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 512, 4, 2, 128, 1024, 320, 2

# K-quant block bytes, the byte offsets of their float16 super-block scales, and a scale
# size that keeps the weights ~0.1 (6-bit sub-scales times 4- to 6-bit quants).
_K_BLOCKS = {
    "Q4_K": (144, (0, 2), 1e-4),
    "Q5_K": (176, (0, 2), 5e-5),
    "Q6_K": (210, (208,), 2e-5),
    "Q2_K": (84, (80, 82), 1e-3),
}
_LAYER_GGUF = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def hf_weights(arch: str, seed: int = 0, tie: bool = True) -> dict[str, np.ndarray]:
    """Random float32 weights in HF names and layout for a tiny ``arch`` model."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {
        "model.embed_tokens.weight": w(VOCAB, HIDDEN, scale=0.2),
        "model.norm.weight": 1 + w(HIDDEN, scale=0.1),
    }
    if not tie:
        out["lm_head.weight"] = w(VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": 1 + w(HIDDEN, scale=0.1),
                p + "post_attention_layernorm.weight": 1 + w(HIDDEN, scale=0.1),
                p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
                p + "mlp.gate_proj.weight": w(INTER, HIDDEN),
                p + "mlp.up_proj.weight": w(INTER, HIDDEN),
                p + "mlp.down_proj.weight": w(HIDDEN, INTER, scale=0.05),
            }
        )
        if arch == "qwen2":
            for n, rows in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
                out[p + f"self_attn.{n}_proj.bias"] = w(rows * HEAD_DIM, scale=0.3)
        if arch == "qwen3":
            out[p + "self_attn.q_norm.weight"] = 1 + w(HEAD_DIM, scale=0.1)
            out[p + "self_attn.k_norm.weight"] = 1 + w(HEAD_DIM, scale=0.1)
    return out


def gguf_name(hf_name: str) -> str:
    glob = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in glob:
        return glob[hf_name]
    parts = hf_name.split(".")  # model.layers.i.<module...>.<weight|bias>
    return f"blk.{parts[2]}.{_LAYER_GGUF['.'.join(parts[3:-1])]}.{parts[-1]}"


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Llama q/k row permutation (what its HF -> GGUF converter does)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _encode(arr: np.ndarray, kind: str, rng: np.random.Generator):
    """``(data, raw_dtype)`` for GGUFWriter.add_tensor; ``data`` is what the file stores."""
    import gguf

    qt = gguf.GGMLQuantizationType[kind]
    if kind == "F32":
        return arr, None
    if kind == "F16":
        return arr.astype(np.float16), None
    if kind in _K_BLOCKS:
        nbytes, scale_offsets, size = _K_BLOCKS[kind]
        rows, cols = arr.shape
        blocks = rng.integers(0, 256, (rows, cols // 256, nbytes), dtype=np.uint8)
        for off in scale_offsets:
            scale = (rng.uniform(0.5, 1.5, (rows, cols // 256)) * size).astype(np.float16)
            blocks[..., off : off + 2] = scale.view(np.uint8).reshape(rows, cols // 256, 2)
        return blocks.reshape(rows, -1), qt
    return gguf.quants.quantize(arr, qt), qt


def write_gguf(
    path: Path,
    arch: str,
    types: dict[str, str] | None = None,
    seed: int = 0,
    tie: bool = True,
    tokenizer_from=None,
    weights: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Write a tiny ``arch`` GGUF to ``path``; returns the HF weights it encodes.

    ``types``: ``{gguf tensor name: ggml type}`` (default F32; 1-D tensors always F32, as
    llama.cpp keeps norms and biases). ``tokenizer_from``: an HF tokenizer to store as
    ``gpt2``-model tokenizer metadata with its chat template.
    """
    import gguf

    types = types or {}
    weights = hf_weights(arch, seed, tie) if weights is None else weights
    rng = np.random.default_rng(seed + 1)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(VOCAB)
    if tokenizer_from is not None:
        _add_tokenizer(w, tokenizer_from)
    for name, arr in weights.items():
        stored = arr
        if arch == "llama" and ".q_proj." in name:
            stored = permute_qk(arr, HEADS)
        elif arch == "llama" and ".k_proj." in name:
            stored = permute_qk(arr, KV_HEADS)
        gname = gguf_name(name)
        kind = types.get(gname, "F32") if arr.ndim == 2 else "F32"
        data, raw = _encode(np.ascontiguousarray(stored), kind, rng)
        w.add_tensor(gname, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


def _add_tokenizer(w, tok) -> None:
    """Store an HF byte-level BPE tokenizer as llama.cpp ``gpt2`` tokenizer metadata."""
    import json

    state = json.loads(tok.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in state.get("added_tokens", []) if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.eos_token_id)
    if tok.pad_token_id is not None:
        w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
