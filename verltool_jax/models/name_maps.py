"""Parameter names: our NNX paths <-> HF (transformers / vLLM) tensor names, one table per family.

HF ``nn.Linear.weight`` is ``[out, in]``; our ``nnx.Linear.kernel`` is ``[in, out]`` so those
entries carry ``transpose=True``. The same table drives ``load_hf``, ``save_hf`` and the
weight sync to samplers (``hf_named_tensors``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .config import ModelConfig


@dataclass(frozen=True)
class ParamMapping:
    """One tensor: its HF name, our parameter path, and whether the HF tensor is the transpose."""
    hf_name: str
    path: tuple
    transpose: bool


@dataclass(frozen=True)
class _Entry:
    hf: str            # HF name; "{i}" is the layer index
    ours: tuple        # our path; the string "{i}" is replaced by the int layer index
    transpose: bool
    when: Optional[str] = None   # ModelConfig boolean field that must be true (None: always)
    unless: Optional[str] = None  # ModelConfig boolean field that must be false


def _linear(hf: str, ours: tuple, bias_flag: Optional[str] = None) -> tuple[_Entry, ...]:
    out = (_Entry(f"{hf}.weight", ours + ("kernel",), True),)
    if bias_flag:
        out += (_Entry(f"{hf}.bias", ours + ("bias",), False, when=bias_flag),)
    return out


_L = "model.layers.{i}"
_GLOBAL = (
    _Entry("model.embed_tokens.weight", ("embed", "embedding"), False),
    _Entry("model.norm.weight", ("final_norm", "weight"), False),
    _Entry("lm_head.weight", ("lm_head", "kernel"), True, unless="tie_word_embeddings"),
)
_LAYER_COMMON = (
    _Entry(f"{_L}.input_layernorm.weight", ("layers", "{i}", "input_norm", "weight"), False),
    _Entry(f"{_L}.post_attention_layernorm.weight",
           ("layers", "{i}", "post_attn_norm", "weight"), False),
    *_linear(f"{_L}.mlp.gate_proj", ("layers", "{i}", "mlp", "gate_proj")),
    *_linear(f"{_L}.mlp.up_proj", ("layers", "{i}", "mlp", "up_proj")),
    *_linear(f"{_L}.mlp.down_proj", ("layers", "{i}", "mlp", "down_proj")),
)


def _attn(o_bias: Optional[str]) -> tuple[_Entry, ...]:
    a = ("layers", "{i}", "attn")
    return (*_linear(f"{_L}.self_attn.q_proj", a + ("q_proj",), "qkv_bias"),
            *_linear(f"{_L}.self_attn.k_proj", a + ("k_proj",), "qkv_bias"),
            *_linear(f"{_L}.self_attn.v_proj", a + ("v_proj",), "qkv_bias"),
            *_linear(f"{_L}.self_attn.o_proj", a + ("o_proj",), o_bias))


_QK_NORM = (
    _Entry(f"{_L}.self_attn.q_norm.weight", ("layers", "{i}", "attn", "q_norm", "weight"), False),
    _Entry(f"{_L}.self_attn.k_norm.weight", ("layers", "{i}", "attn", "k_norm", "weight"), False),
)

# The one table per family: (global entries, per-layer entries).
FAMILY_TABLES: dict[str, tuple[tuple[_Entry, ...], tuple[_Entry, ...]]] = {
    "qwen2": (_GLOBAL, _LAYER_COMMON + _attn(None)),                      # q/k/v bias
    "qwen3": (_GLOBAL, _LAYER_COMMON + _attn("o_bias") + _QK_NORM),      # q/k norm
    "llama": (_GLOBAL, _LAYER_COMMON + _attn("o_bias")),                 # attention_bias: all 4
}


def _active(e: _Entry, cfg: ModelConfig) -> bool:
    if e.when and not getattr(cfg, e.when):
        return False
    if e.unless and getattr(cfg, e.unless):
        return False
    return True


def param_table(config: ModelConfig) -> list[ParamMapping]:
    """Every parameter of a model with ``config``, in HF checkpoint order."""
    if config.model_type not in FAMILY_TABLES:
        raise ValueError(f"no name map for model_type {config.model_type!r}; "
                         f"known: {sorted(FAMILY_TABLES)}")
    glob, layer = FAMILY_TABLES[config.model_type]
    out = [ParamMapping(e.hf, e.ours, e.transpose) for e in glob[:1] if _active(e, config)]
    for i in range(config.num_layers):
        for e in layer:
            if _active(e, config):
                path = tuple(i if p == "{i}" else p for p in e.ours)
                out.append(ParamMapping(e.hf.format(i=i), path, e.transpose))
    out += [ParamMapping(e.hf, e.ours, e.transpose) for e in glob[1:] if _active(e, config)]
    return out


def hf_to_path(config: ModelConfig) -> dict[str, ParamMapping]:
    """``{hf_name: ParamMapping}`` for loading."""
    return {m.hf_name: m for m in param_table(config)}
