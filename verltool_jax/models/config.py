"""``ModelConfig``: the architecture of a decoder-only policy, read from an HF ``config.json``.

One config drives one model code path; the family differences are switches:

* Qwen2 / Qwen2.5: ``qkv_bias=True`` (bias on q/k/v projections only).
* Qwen3: ``qk_norm=True`` (RMSNorm over ``head_dim`` on q and k before RoPE), no bias.
* Llama 3.x: ``rope_scaling`` of type ``llama3``; ``attention_bias`` puts a bias on
  q/k/v *and* o.

Both HF layouts of the RoPE settings are read: transformers < 5 writes ``rope_theta`` +
``rope_scaling``; transformers >= 5 writes ``rope_parameters`` (which holds ``rope_theta``).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (HF ``rope_scaling`` / ``rope_parameters``).

    ``rope_type``: ``linear`` divides every frequency by ``factor``; ``llama3`` divides
    only the low frequencies (wavelength > original_max / low_freq_factor) by ``factor``
    and interpolates smoothly between high and low (see ``rope.rope_inv_freq``).
    """
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def to_hf(self, rope_theta: float) -> dict:
        d: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": rope_theta}
        if self.rope_type in ("linear", "llama3"):
            d["factor"] = self.factor
        if self.rope_type == "llama3":
            d.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor,
                     original_max_position_embeddings=self.original_max_position_embeddings)
        return d


@dataclass(frozen=True)
class ModelConfig:
    """Architecture + numerics of a decoder-only transformer (hashable: usable as a static arg).

    ``dtype`` is the compute dtype of activations and matmuls, ``param_dtype`` the storage
    dtype of weights; logits are always returned in float32. ``remat_policy`` selects
    per-layer rematerialisation: ``none`` (store all activations), ``full`` (recompute the
    whole layer in the backward pass), ``dots`` (save matmul outputs, recompute the rest),
    ``dots_no_batch`` (save only matmuls without batch dimensions).
    """
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    model_type: str = "qwen2"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat_policy: str = "none"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"ModelConfig.model_type must be one of {SUPPORTED_MODEL_TYPES}, "
                             f"got {self.model_type!r}")
        if self.rope_scaling.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"ModelConfig.rope_scaling.rope_type must be one of "
                             f"{SUPPORTED_ROPE_TYPES}, got {self.rope_scaling.rope_type!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ModelConfig.{name} must be one of {DTYPES}, "
                                 f"got {getattr(self, name)!r}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"ModelConfig.remat_policy must be one of {REMAT_POLICIES}, "
                             f"got {self.remat_policy!r}")

    def replace(self, **kw) -> "ModelConfig":
        """A copy with fields replaced (e.g. ``cfg.replace(dtype='bfloat16')``)."""
        return dataclasses.replace(self, **kw)

    @property
    def family(self) -> str:
        return self.model_type

    # ------------------------------------------------------------------ HF interop
    @classmethod
    def from_hf_dict(cls, d: dict, **overrides) -> "ModelConfig":
        """Build from the fields of an HF ``config.json``; ``overrides`` set our own fields
        (``dtype``, ``param_dtype``, ``remat_policy``, ...)."""
        mt = d.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"config.json model_type must be one of {SUPPORTED_MODEL_TYPES}, "
                             f"got {mt!r}")
        if d.get("use_sliding_window"):
            raise ValueError("config.json use_sliding_window=true is not supported; "
                             "set it to false (full attention)")
        if d.get("mlp_bias"):
            raise ValueError("config.json mlp_bias=true is not supported (no family we train "
                             "uses it); set it to false")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json hidden_act must be 'silu', got {d.get('hidden_act')!r}")
        rope = dict(d.get("rope_parameters") or {})
        legacy = d.get("rope_scaling") or {}
        rope = {**legacy, **rope}
        theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        rtype = rope.get("rope_type", rope.get("type", "default"))
        scaling = RopeScaling(
            rope_type=rtype, factor=float(rope.get("factor", 1.0)),
            low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(rope.get(
                "original_max_position_embeddings", d.get("max_position_embeddings", 8192))))
        heads = int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or int(d["hidden_size"]) // heads
        attn_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        kw = dict(
            vocab_size=int(d["vocab_size"]), hidden_size=int(d["hidden_size"]),
            num_layers=int(d["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads), head_dim=int(head_dim),
            intermediate_size=int(d["intermediate_size"]), model_type=mt,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=(mt == "qwen2") or attn_bias, o_bias=(mt != "qwen2") and attn_bias,
            qk_norm=(mt == "qwen3"), bos_token_id=d.get("bos_token_id"), eos_token_id=eos,
            pad_token_id=d.get("pad_token_id"))
        kw.update(overrides)
        return cls(**kw)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides) -> "ModelConfig":
        """Read ``<path>/config.json`` (``path`` may also be the json file itself)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.exists():
            raise FileNotFoundError(f"no HF config.json at {p}; pass a checkpoint directory")
        with open(p) as f:
            return cls.from_hf_dict(json.load(f), **overrides)

    def to_hf_dict(self) -> dict:
        """The HF ``config.json`` fields (transformers and vLLM read these)."""
        arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "llama": "LlamaForCausalLM"}[self.model_type]
        rope = self.rope_scaling.to_hf(self.rope_theta)
        d: dict[str, Any] = dict(
            architectures=[arch], model_type=self.model_type, vocab_size=self.vocab_size,
            hidden_size=self.hidden_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim, intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
            rope_parameters=rope,
            rope_scaling=None if self.rope_scaling.rope_type == "default" else rope,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings, hidden_act="silu",
            bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id, torch_dtype=self.param_dtype,
            dtype=self.param_dtype, attention_dropout=0.0, use_cache=True)
        if self.model_type == "qwen2":
            if self.head_dim * self.num_heads != self.hidden_size:
                raise ValueError("qwen2 checkpoints derive head_dim = hidden_size / num_heads; "
                                 "this config cannot be written as qwen2")
            if self.o_bias or not self.qkv_bias or self.qk_norm:
                raise ValueError("qwen2 has qkv bias, no o bias, no qk norm")
            d.update(use_sliding_window=False, max_window_layers=self.num_layers)
        else:
            if self.qkv_bias != self.o_bias:
                raise ValueError(f"{self.model_type}: attention_bias applies to q/k/v and o alike")
            d.update(attention_bias=self.qkv_bias)
            if self.model_type == "llama":
                d.update(mlp_bias=False)
            else:
                d.update(use_sliding_window=False, max_window_layers=self.num_layers)
        return d
