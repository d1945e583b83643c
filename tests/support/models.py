"""Shared test support for the model tests: tiny HF checkpoints with *perturbed* weights.

HF initialises norms to 1, biases to 0 and everything else with std 0.02, which would
let a swapped norm or a dropped bias pass a parity test. Every tensor here gets noise of
std 0.1 on top, so each parameter visibly changes the logits. Built once per process.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np

_ROOT = Path(tempfile.mkdtemp(prefix="vtj_models_"))
atexit.register(shutil.rmtree, _ROOT, True)


@functools.cache
def tokenizer_dir() -> Path:
    from verltool_jax.models.tiny import build_tokenizer

    d = _ROOT / "tokenizer"
    build_tokenizer(d, vocab_size=512)
    return d


@functools.cache
def tiny_ckpt(family: str, tie: bool = True) -> Path:
    """A tiny (hidden 128, 2 layers, head_dim 64, vocab 512) checkpoint of ``family``."""
    import torch
    from transformers import AutoModelForCausalLM

    from verltool_jax.models.tiny import build_tiny_hf

    d = _ROOT / f"{family}_{'tied' if tie else 'untied'}"
    kw = {} if family == "qwen2" else {"num_heads": 4, "num_kv_heads": 2}  # head_dim 64, GQA 2
    build_tiny_hf(d, family, tokenizer_dir=tokenizer_dir(), tie_word_embeddings=tie, **kw)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(d)
    return d


def hf_model(path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers logits with positions = cumsum(mask) - 1 (what our model uses)."""
    import torch

    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(pos),
        )
    logits = out.logits
    return (logits if logits.dtype == torch.float64 else logits.float()).numpy()


def hf_float64(model):
    """``model`` (a transformers Llama / Qwen2 / Qwen3 causal LM) computing in float64
    throughout, in place: ``.double()`` alone leaves its RMSNorm (``x.to(float32)``), its
    RoPE (angles, cos and sin in float32) and the eager attention softmax
    (``dtype=float32``) in float32; here the norms and RoPE compute in the input dtype and
    attention is sdpa. (Eager attention in float64 also turns padding queries into NaN,
    which then reach real tokens as ``0 * NaN``.) The weights are the float32 ones, exactly."""
    import torch

    def rms_norm(norm):
        def forward(h):
            var = h.pow(2).mean(-1, keepdim=True)
            return norm.weight * (h * torch.rsqrt(var + norm.variance_epsilon))

        return forward

    def rope(rot):
        def forward(x, position_ids):
            freqs = position_ids[..., None].to(x.dtype) * rot.inv_freq.to(x.dtype)
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos() * rot.attention_scaling, emb.sin() * rot.attention_scaling

        return forward

    model.double()
    model.set_attn_implementation("sdpa")
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = rms_norm(m)
        elif type(m).__name__.endswith("RotaryEmbedding"):
            m.forward = rope(m)
    return model


def chat_batch(tok, questions) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, mask)`` int64: each question as a user turn of ``tok``'s chat template (with
    the generation prompt), left-padded with ``tok.pad_token_id`` to the longest."""
    from verltool_jax.data.templating import prompt_token_ids

    rows = [prompt_token_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    T = max(map(len, rows))
    ids = np.full((len(rows), T), tok.pad_token_id, np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :] = r
        mask[i, T - len(r) :] = 1
    return ids, mask


def padded_batch(seed: int = 0, vocab: int = 512, T: int = 12):
    """A batch of 4 rows of different lengths: two left-padded, two right-padded."""
    rng = np.random.default_rng(seed)
    lengths = [12, 7, 9, 4]
    left = [True, True, False, False]
    ids = np.zeros((4, T), np.int64)
    mask = np.zeros((4, T), np.int64)
    for b, (n, lp) in enumerate(zip(lengths, left)):
        toks = rng.integers(3, vocab, n)
        sl = slice(T - n, T) if lp else slice(0, n)
        ids[b, sl] = toks
        mask[b, sl] = 1
    return ids, mask
