"""Parameter names: our NNX paths <-> HF (transformers / vLLM) tensor names, one table per family.

HF ``nn.Linear.weight`` is ``[out, in]``; our ``nnx.Linear.kernel`` is ``[in, out]`` so those
entries carry ``transpose=True``. A vision-language model (``qwen2_5_vl``, ``qwen2_vl``) is
the ``qwen2`` decoder table plus its vision tower's table; its checkpoint names are the
hub's (``model.layers.*``, ``visual.*``, ``lm_head.weight``; transformers >= 5 writes these
too), and the ``model.language_model.*`` / ``model.visual.*`` spelling some
transformers 4.x versions wrote is read as well (``canonical_hf_name``). The same table
drives ``load_hf``, ``save_hf`` and the weight sync to samplers (``hf_named_tensors``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig


@dataclass(frozen=True)
class ParamMapping:
    """One tensor: its HF name, our parameter path, and whether the HF tensor is the transpose.

    ``hf_shape`` is set where the HF tensor is not a plain matrix: the vision patch
    embedding is a Conv3d weight ``[W, C, Tp, P, P]`` whose kernel equals its stride, i.e.
    our ``[C*Tp*P*P, W]`` linear kernel transposed and reshaped.
    """

    hf_name: str
    path: tuple
    transpose: bool
    hf_shape: tuple | None = None

    def to_ours(self, arr):
        """HF tensor -> our layout."""
        if self.hf_shape is not None:
            arr = arr.reshape(arr.shape[0], -1)
        return arr.T if self.transpose else arr

    def to_hf(self, arr):
        """Our array -> HF layout."""
        arr = arr.T if self.transpose else arr
        return arr.reshape(self.hf_shape) if self.hf_shape is not None else arr


@dataclass(frozen=True)
class _Entry:
    hf: str  # HF name; "{i}" is the layer index
    ours: tuple  # our path; the string "{i}" is replaced by the int layer index
    transpose: bool
    when: str | None = None  # ModelConfig boolean field that must be true (None: always)
    unless: str | None = None  # ModelConfig boolean field that must be false


def _linear(hf: str, ours: tuple, bias_flag: str | bool | None = None) -> tuple[_Entry, ...]:
    """A linear layer's weight, and its bias: always (``True``), never (``None``) or when the
    named ``ModelConfig`` flag is true."""
    out: tuple[_Entry, ...] = (_Entry(f"{hf}.weight", ours + ("kernel",), True),)
    if bias_flag:
        when = bias_flag if isinstance(bias_flag, str) else None
        out += (_Entry(f"{hf}.bias", ours + ("bias",), False, when=when),)
    return out


_L = "model.layers.{i}"
_GLOBAL = (
    _Entry("model.embed_tokens.weight", ("embed", "embedding"), False),
    _Entry("model.norm.weight", ("final_norm", "weight"), False),
    _Entry("lm_head.weight", ("lm_head", "kernel"), True, unless="tie_word_embeddings"),
)
_LAYER_COMMON = (
    _Entry(f"{_L}.input_layernorm.weight", ("layers", "{i}", "input_norm", "weight"), False),
    _Entry(
        f"{_L}.post_attention_layernorm.weight",
        ("layers", "{i}", "post_attn_norm", "weight"),
        False,
    ),
    *_linear(f"{_L}.mlp.gate_proj", ("layers", "{i}", "mlp", "gate_proj")),
    *_linear(f"{_L}.mlp.up_proj", ("layers", "{i}", "mlp", "up_proj")),
    *_linear(f"{_L}.mlp.down_proj", ("layers", "{i}", "mlp", "down_proj")),
)


def _attn(o_bias: str | None) -> tuple[_Entry, ...]:
    a = ("layers", "{i}", "attn")
    return (
        *_linear(f"{_L}.self_attn.q_proj", a + ("q_proj",), "qkv_bias"),
        *_linear(f"{_L}.self_attn.k_proj", a + ("k_proj",), "qkv_bias"),
        *_linear(f"{_L}.self_attn.v_proj", a + ("v_proj",), "qkv_bias"),
        *_linear(f"{_L}.self_attn.o_proj", a + ("o_proj",), o_bias),
    )


_QK_NORM = (
    _Entry(f"{_L}.self_attn.q_norm.weight", ("layers", "{i}", "attn", "q_norm", "weight"), False),
    _Entry(f"{_L}.self_attn.k_norm.weight", ("layers", "{i}", "attn", "k_norm", "weight"), False),
)

# The one table per family: (global entries, per-layer entries).
FAMILY_TABLES: dict[str, tuple[tuple[_Entry, ...], tuple[_Entry, ...]]] = {
    "qwen2": (_GLOBAL, _LAYER_COMMON + _attn(None)),  # q/k/v bias
    "qwen3": (_GLOBAL, _LAYER_COMMON + _attn("o_bias") + _QK_NORM),  # q/k norm
    "llama": (_GLOBAL, _LAYER_COMMON + _attn("o_bias")),  # attention_bias: all 4
}


_V = "visual.blocks.{i}"
_VB = ("visual", "blocks", "{i}")


def _vision_block(kind: str) -> tuple[_Entry, ...]:
    """Per-block tensors of the vision tower of ``kind``."""
    attn = (
        *_linear(f"{_V}.attn.qkv", _VB + ("attn", "qkv"), True),
        *_linear(f"{_V}.attn.proj", _VB + ("attn", "proj"), True),
    )
    norms: tuple[_Entry, ...]
    if kind == "qwen2_5_vl":
        norms = (
            _Entry(f"{_V}.norm1.weight", _VB + ("norm1", "weight"), False),
            _Entry(f"{_V}.norm2.weight", _VB + ("norm2", "weight"), False),
        )
        mlp = tuple(
            e
            for n in ("gate_proj", "up_proj", "down_proj")
            for e in _linear(f"{_V}.mlp.{n}", _VB + ("mlp", n), True)
        )
    else:
        norms = tuple(
            _Entry(f"{_V}.{n}.{hf}", _VB + (n, ours), False)
            for n in ("norm1", "norm2")
            for hf, ours in (("weight", "scale"), ("bias", "bias"))
        )
        mlp = tuple(
            e for n in ("fc1", "fc2") for e in _linear(f"{_V}.mlp.{n}", _VB + ("mlp", n), True)
        )
    return norms + attn + mlp


def _vision_global(kind: str) -> tuple[_Entry, ...]:
    """Tensors of the vision tower outside its blocks (patch embedding, merger)."""
    m = ("visual", "merger")
    ln: tuple[_Entry, ...]
    if kind == "qwen2_5_vl":
        ln = (_Entry("visual.merger.ln_q.weight", m + ("ln_q", "weight"), False),)
    else:
        ln = (
            _Entry("visual.merger.ln_q.weight", m + ("ln_q", "scale"), False),
            _Entry("visual.merger.ln_q.bias", m + ("ln_q", "bias"), False),
        )
    return (
        _Entry("visual.patch_embed.proj.weight", ("visual", "patch_embed", "kernel"), True),
        *ln,
        *_linear("visual.merger.mlp.0", m + ("mlp_in",), True),
        *_linear("visual.merger.mlp.2", m + ("mlp_out",), True),
    )


VISION_TABLES: dict[str, tuple[tuple[_Entry, ...], tuple[_Entry, ...]]] = {
    kind: (_vision_global(kind), _vision_block(kind)) for kind in ("qwen2_5_vl", "qwen2_vl")
}
for _kind in VISION_TABLES:
    FAMILY_TABLES[_kind] = FAMILY_TABLES["qwen2"]  # the decoder of both VL models is Qwen2

# transformers 4.x (4.52 .. 4.57) wrote VL checkpoints with these prefixes.
_LEGACY_VL_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def canonical_hf_name(name: str) -> str:
    """The hub spelling of a tensor name (``model.language_model.x`` -> ``model.x``,
    ``model.visual.x`` -> ``visual.x``); other names are returned unchanged."""
    for old, new in _LEGACY_VL_PREFIXES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _active(e: _Entry, cfg: ModelConfig) -> bool:
    if e.when and not getattr(cfg, e.when):
        return False
    if e.unless and getattr(cfg, e.unless):
        return False
    return True


def param_table(config: ModelConfig) -> list[ParamMapping]:
    """Every parameter of a model with ``config``, in HF checkpoint order."""
    if config.model_type not in FAMILY_TABLES:
        raise ValueError(
            f"no name map for model_type {config.model_type!r}; known: {sorted(FAMILY_TABLES)}"
        )
    glob, layer = FAMILY_TABLES[config.model_type]
    out = [ParamMapping(e.hf, e.ours, e.transpose) for e in glob[:1] if _active(e, config)]
    for i in range(config.num_layers):
        for e in layer:
            if _active(e, config):
                path = tuple(i if p == "{i}" else p for p in e.ours)
                out.append(ParamMapping(e.hf.format(i=i), path, e.transpose))
    out += [ParamMapping(e.hf, e.ours, e.transpose) for e in glob[1:] if _active(e, config)]
    if config.vision is not None:
        v = config.vision
        vglob, vblock = VISION_TABLES[v.kind]
        conv = (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
        out += [
            ParamMapping(
                e.hf,
                e.ours,
                e.transpose,
                conv if e.hf == "visual.patch_embed.proj.weight" else None,
            )
            for e in vglob[:1]
        ]
        for i in range(v.depth):
            out += [
                ParamMapping(
                    e.hf.format(i=i), tuple(i if p == "{i}" else p for p in e.ours), e.transpose
                )
                for e in vblock
            ]
        out += [ParamMapping(e.hf, e.ours, e.transpose) for e in vglob[1:]]
    return out


def hf_to_path(config: ModelConfig) -> dict[str, ParamMapping]:
    """``{hf_name: ParamMapping}`` for loading."""
    return {m.hf_name: m for m in param_table(config)}
