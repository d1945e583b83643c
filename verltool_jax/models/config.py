"""``ModelConfig``: the architecture of a decoder-only policy, read from an HF ``config.json``.

One config drives one model code path; the family differences are switches:

* Qwen2 / Qwen2.5: ``qkv_bias=True`` (bias on q/k/v projections only).
* Qwen3: ``qk_norm=True`` (RMSNorm over ``head_dim`` on q and k before RoPE), no bias.
* Llama 3.x: ``rope_scaling`` of type ``llama3``; ``attention_bias`` puts a bias on
  q/k/v *and* o.

* Qwen2.5-VL / Qwen2-VL (``qwen2_5_vl``, ``qwen2_vl``): a Qwen2 language model with
  multimodal RoPE (``mrope_section``) plus a vision tower (``vision``, a
  :class:`VisionConfig`) and the image placeholder token ids. Both HF layouts of their
  ``config.json`` are read: the hub's flat one (text fields at the top level,
  ``rope_scaling: {type: mrope, mrope_section}``) and transformers >= 5's nested
  ``text_config`` / ``vision_config``; the nested one is written.

Both HF layouts of the RoPE settings are read: transformers < 5 writes ``rope_theta`` +
``rope_scaling``; transformers >= 5 writes ``rope_parameters`` (which holds ``rope_theta``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VL_MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl")
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama") + VL_MODEL_TYPES
VL_ARCHITECTURES = {
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
# float64: a numerical reference (every op in float64; needs jax_enable_x64, e.g. inside
# ``with jax.enable_x64(True):``), used to check parity against transformers in float64.
DTYPES = ("float32", "bfloat16", "float16", "float64")


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
            d.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position_embeddings,
            )
        return d


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower of Qwen2.5-VL / Qwen2-VL (HF ``vision_config``).

    Images arrive as patches of ``in_channels x temporal_patch_size x patch_size x
    patch_size`` pixels; ``depth`` blocks of width ``hidden_size`` (``num_heads`` heads)
    run over them; the merger joins each ``spatial_merge_size x spatial_merge_size``
    block of patches into one token of width ``out_hidden_size`` (the language model's
    hidden size).

    ``kind`` picks the block: ``qwen2_5_vl`` (RMSNorm, SwiGLU MLP with bias, window
    attention over ``window_size x window_size`` pixels except the blocks listed in
    ``fullatt_block_indexes``, which attend over the whole image) or ``qwen2_vl``
    (LayerNorm, ``fc1 -> hidden_act -> fc2`` MLP, full attention everywhere).
    HF ``qwen2_vl`` names the width ``embed_dim`` and the output ``hidden_size``; here both
    kinds use the Qwen2.5-VL names.
    """

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    kind: str = "qwen2_5_vl"
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = ()
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    tokens_per_second: int = 4
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in (
            "depth",
            "hidden_size",
            "intermediate_size",
            "num_heads",
            "out_hidden_size",
            "patch_size",
            "temporal_patch_size",
            "spatial_merge_size",
            "in_channels",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"VisionConfig.{name} must be a positive int, got {v!r}")
        if self.kind not in VL_MODEL_TYPES:
            raise ValueError(
                f"VisionConfig.kind must be one of {VL_MODEL_TYPES}, got {self.kind!r}"
            )
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ValueError(
                f"VisionConfig.hidden_size ({self.hidden_size}) / num_heads "
                f"({self.num_heads}) must be a multiple of 4 (2-D RoPE)"
            )
        bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
        if bad:
            raise ValueError(
                f"VisionConfig.fullatt_block_indexes {bad} outside 0..{self.depth - 1}"
            )
        acts = ("silu",) if self.kind == "qwen2_5_vl" else ("quick_gelu", "gelu", "silu")
        if self.hidden_act not in acts:
            raise ValueError(
                f"VisionConfig.hidden_act must be one of {acts} for {self.kind}, "
                f"got {self.hidden_act!r}"
            )
        if self.kind == "qwen2_5_vl":
            unit = self.patch_size * self.spatial_merge_size
            if self.window_size < unit or self.window_size % unit:
                raise ValueError(
                    f"VisionConfig.window_size ({self.window_size}) must be a "
                    f"positive multiple of patch_size * spatial_merge_size ({unit})"
                )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch: ``in_channels * temporal_patch_size * patch_size**2``."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    def full_attention(self, block: int) -> bool:
        """Whether ``block`` attends over the whole image (else within its window)."""
        return self.kind == "qwen2_vl" or block in self.fullatt_block_indexes

    @classmethod
    def from_hf_dict(cls, kind: str, d: dict) -> VisionConfig:
        """Read an HF ``vision_config`` of ``kind`` (``qwen2_5_vl`` or ``qwen2_vl``)."""
        rope = d.get("rope_parameters") or {}
        common: dict[str, Any] = dict(
            kind=kind,
            depth=int(d["depth"]),
            num_heads=int(d["num_heads"]),
            patch_size=int(d.get("patch_size", 14)),
            temporal_patch_size=int(d.get("temporal_patch_size", 2)),
            spatial_merge_size=int(d.get("spatial_merge_size", 2)),
            in_channels=int(d.get("in_channels", d.get("in_chans", 3))),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
        )
        if kind == "qwen2_vl":
            width = int(d["embed_dim"])
            return cls(
                hidden_size=width,
                intermediate_size=int(width * d.get("mlp_ratio", 4)),
                out_hidden_size=int(d["hidden_size"]),
                window_size=0,
                hidden_act=d.get("hidden_act", "quick_gelu"),
                **common,
            )
        return cls(
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            out_hidden_size=int(d["out_hidden_size"]),
            window_size=int(d.get("window_size", 112)),
            fullatt_block_indexes=tuple(int(i) for i in d.get("fullatt_block_indexes", ())),
            hidden_act=d.get("hidden_act", "silu"),
            tokens_per_second=int(d.get("tokens_per_second", 4)),
            **common,
        )

    def to_hf_dict(self) -> dict:
        d: dict[str, Any] = dict(
            depth=self.depth,
            num_heads=self.num_heads,
            in_channels=self.in_channels,
            patch_size=self.patch_size,
            temporal_patch_size=self.temporal_patch_size,
            spatial_merge_size=self.spatial_merge_size,
            hidden_act=self.hidden_act,
            model_type=f"{self.kind}_vision",
        )
        if self.kind == "qwen2_vl":
            if self.intermediate_size % self.hidden_size:
                raise ValueError(
                    "qwen2_vl writes the MLP width as embed_dim * mlp_ratio; "
                    "intermediate_size must be a multiple of hidden_size"
                )
            d.update(
                embed_dim=self.hidden_size,
                hidden_size=self.out_hidden_size,
                mlp_ratio=self.intermediate_size // self.hidden_size,
            )
            if self.rope_theta != 10000.0:
                raise ValueError("qwen2_vl vision RoPE has a fixed theta of 10000")
            return d
        d.update(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            out_hidden_size=self.out_hidden_size,
            window_size=self.window_size,
            fullatt_block_indexes=list(self.fullatt_block_indexes),
            tokens_per_second=self.tokens_per_second,
            rope_parameters={"rope_type": "axial", "rope_theta": self.rope_theta},
        )
        return d


def layers_scanned(scan_layers: bool | None, remat_policy: str) -> bool:
    """``ModelConfig.scan_layers`` resolved: True/False as given; None scans exactly when
    ``remat_policy`` is not ``none``."""
    if scan_layers is None:
        return remat_policy != "none"
    return scan_layers


@dataclass(frozen=True)
class ModelConfig:
    """Architecture + numerics of a decoder-only transformer (hashable: usable as a static arg).

    ``dtype`` is the compute dtype of activations and matmuls, ``param_dtype`` the storage
    dtype of weights; logits are returned in float32 (float64 for a float64 model, see
    ``DTYPES``). ``remat_policy`` selects per-layer rematerialisation: ``none`` (store all
    activations), ``full`` (recompute the whole layer in the backward pass), ``dots``
    (save matmul outputs, recompute the rest), ``dots_no_batch`` (save only matmuls
    without batch dimensions). ``attention_query_chunk``: sequences longer than this many
    tokens attend that many queries at a time (``layers.attention_weights_apply``; 0: all
    at once), which bounds the attention scores' memory at long contexts.
    ``attention_causal_block``: without a KV cache (training, scoring) queries go this
    many at a time and each block scores only the keys up to its last query (5/8 of the
    one pass's attention work at 512 tokens, nearer half beyond; 0: one pass). ``scan_layers``:
    the plain forward (training, scoring) runs each run of identical consecutive layers as
    one ``lax.scan`` over their stacked weights (``transformer.scan_run``): one layer to
    compile instead of N, and with remat the backward pass keeps only each layer's input;
    None (the default) scans exactly when ``remat_policy`` is not ``none`` (without remat
    the scan saves no memory and its stacked residuals cost time: docs/performance.md);
    decoding with a KV cache always runs the layers one by one.

    Vision-language models (``model_type`` in ``VL_MODEL_TYPES``) add ``vision`` (the
    tower), ``mrope_section`` (how many of the ``head_dim // 2`` RoPE frequencies follow
    the temporal, height and width position; empty = plain 1-D RoPE) and the special
    token ids the processor writes around an image.
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
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat_policy: str = "none"
    attention_query_chunk: int = 512
    attention_causal_block: int = 128
    scan_layers: bool | None = None
    mrope_section: tuple[int, ...] = ()
    vision: VisionConfig | None = None
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    # LoRA adapters (models.lora): rank 0 = none; targets of the last N layers (0: all)
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    lora_last_layers: int = 0

    @property
    def scans_layers(self) -> bool:
        """Whether the plain forward runs its layers in ``lax.scan`` (:func:`layers_scanned`)."""
        return layers_scanned(self.scan_layers, self.remat_policy)

    @property
    def lora_scale(self) -> float:
        """``alpha / rank``, the factor on the adapter's output (0 without adapters)."""
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention"
            )
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"ModelConfig.model_type must be one of {SUPPORTED_MODEL_TYPES}, "
                f"got {self.model_type!r}"
            )
        if self.rope_scaling.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"ModelConfig.rope_scaling.rope_type must be one of "
                f"{SUPPORTED_ROPE_TYPES}, got {self.rope_scaling.rope_type!r}"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"ModelConfig.{name} must be one of {DTYPES}, got {getattr(self, name)!r}"
                )
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"ModelConfig.remat_policy must be one of {REMAT_POLICIES}, "
                f"got {self.remat_policy!r}"
            )
        if not isinstance(self.attention_causal_block, int) or self.attention_causal_block < 0:
            raise ValueError(
                f"ModelConfig.attention_causal_block must be an int >= 0 (0: all "
                f"queries in one pass), got {self.attention_causal_block!r}"
            )
        if not isinstance(self.attention_query_chunk, int) or self.attention_query_chunk < 0:
            raise ValueError(
                f"ModelConfig.attention_query_chunk must be an int >= 0 (0: all "
                f"queries in one pass), got {self.attention_query_chunk!r}"
            )
        if self.scan_layers is not None and not isinstance(self.scan_layers, bool):
            raise ValueError(
                f"ModelConfig.scan_layers must be True, False or None (scan "
                f"when remat_policy is not 'none'), got {self.scan_layers!r}"
            )
        if self.lora_rank < 0 or self.lora_last_layers < 0:
            raise ValueError(
                f"ModelConfig.lora_rank ({self.lora_rank}) and lora_last_layers "
                f"({self.lora_last_layers}) must be >= 0"
            )
        if self.mrope_section and sum(self.mrope_section) != self.head_dim // 2:
            raise ValueError(
                f"ModelConfig.mrope_section {self.mrope_section} must sum to "
                f"head_dim // 2 = {self.head_dim // 2}"
            )
        if self.model_type in VL_MODEL_TYPES:
            if self.vision is None or self.vision.kind != self.model_type:
                raise ValueError(
                    f"ModelConfig.vision must be a VisionConfig of kind "
                    f"{self.model_type!r} for model_type {self.model_type!r}"
                )
            if self.vision.out_hidden_size != self.hidden_size:
                raise ValueError(
                    f"VisionConfig.out_hidden_size ({self.vision.out_hidden_size}) "
                    f"must equal ModelConfig.hidden_size ({self.hidden_size})"
                )
            if self.image_token_id is None:
                raise ValueError(
                    "ModelConfig.image_token_id is required for a vision-language "
                    "model (config.json image_token_id)"
                )
        elif self.vision is not None:
            raise ValueError(
                f"model_type {self.model_type!r} is text-only; a vision tower needs "
                f"one of {VL_MODEL_TYPES}"
            )

    def replace(self, **kw) -> ModelConfig:
        """A copy with fields replaced (e.g. ``cfg.replace(dtype='bfloat16')``)."""
        return dataclasses.replace(self, **kw)

    @property
    def family(self) -> str:
        return self.model_type

    @property
    def is_vision_language(self) -> bool:
        return self.vision is not None

    def require_vision(self) -> VisionConfig:
        """``vision``, for code that only runs for a vision-language model."""
        if self.vision is None:
            raise ValueError(
                f"a {self.model_type} ModelConfig has no vision tower (vision is None); "
                "this needs a vision-language model (Qwen2-VL, Qwen2.5-VL)"
            )
        return self.vision

    def require_token_id(self, name: str) -> int:
        """The special token id field ``name`` (``image_token_id``, ``vision_start_token_id``,
        ...), which a vision-language model needs."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(
                f"ModelConfig.{name} is None; a vision-language model needs it (config.json {name})"
            )
        return value

    # ------------------------------------------------------------------ HF interop
    @classmethod
    def from_hf_dict(cls, d: dict, **overrides) -> ModelConfig:
        """Build from the fields of an HF ``config.json``; ``overrides`` set our own fields
        (``dtype``, ``param_dtype``, ``remat_policy``, ...)."""
        mt = d.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"config.json model_type must be one of {SUPPORTED_MODEL_TYPES}, got {mt!r}"
            )
        if mt in VL_MODEL_TYPES:
            return cls._from_hf_vl_dict(d, **overrides)
        if d.get("use_sliding_window"):
            raise ValueError(
                "config.json use_sliding_window=true is not supported; "
                "set it to false (full attention)"
            )
        if d.get("mlp_bias"):
            raise ValueError(
                "config.json mlp_bias=true is not supported (no family we train "
                "uses it); set it to false"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json hidden_act must be 'silu', got {d.get('hidden_act')!r}")
        rope = dict(d.get("rope_parameters") or {})
        legacy = d.get("rope_scaling") or {}
        rope = {**legacy, **rope}
        theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        rtype = rope.get("rope_type", rope.get("type", "default"))
        if not isinstance(rtype, str):
            raise ValueError(f"config.json rope_type must be a string, got {rtype!r}")
        scaling = RopeScaling(
            rope_type=rtype,
            factor=float(rope.get("factor", 1.0)),
            low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                rope.get("original_max_position_embeddings", d.get("max_position_embeddings", 8192))
            ),
        )
        heads = int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or int(d["hidden_size"]) // heads
        attn_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        kw = dict(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            intermediate_size=int(d["intermediate_size"]),
            model_type=mt,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=(mt == "qwen2") or attn_bias,
            o_bias=(mt != "qwen2") and attn_bias,
            qk_norm=(mt == "qwen3"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=d.get("pad_token_id"),
        )
        kw.update(overrides)
        return cls(**kw)

    @classmethod
    def _from_hf_vl_dict(cls, d: dict, **overrides) -> ModelConfig:
        """A VL ``config.json``: the text fields (nested ``text_config`` or top level) are a
        Qwen2 language model whose RoPE carries ``mrope_section``."""
        mt = d["model_type"]
        if "vision_config" not in d:
            raise ValueError(f"config.json of a {mt} model needs a vision_config")
        nested = d.get("text_config") or {}
        text = {
            k: v for k, v in {**d, **nested}.items() if k not in ("vision_config", "text_config")
        }
        rope = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
        section = tuple(int(s) for s in rope.pop("mrope_section", ()) or ())
        if rope.get("rope_type", rope.get("type")) in ("mrope", "default", None):
            rope.pop("type", None)
            rope["rope_type"] = "default"
        text.update(
            model_type="qwen2",
            rope_parameters=rope,
            rope_scaling=None,
            tie_word_embeddings=bool(
                d.get("tie_word_embeddings") or nested.get("tie_word_embeddings")
            ),
        )
        base = cls.from_hf_dict(text)
        kw = dict(
            model_type=mt,
            mrope_section=section,
            vision=VisionConfig.from_hf_dict(mt, d["vision_config"]),
            **{
                k: d.get(k)
                for k in (
                    "image_token_id",
                    "video_token_id",
                    "vision_start_token_id",
                    "vision_end_token_id",
                )
            },
        )
        kw.update(overrides)
        return base.replace(**kw)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides) -> ModelConfig:
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
        if self.model_type in VL_MODEL_TYPES:
            return self._to_hf_vl_dict()
        arch = {
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "llama": "LlamaForCausalLM",
        }[self.model_type]
        rope = self.rope_scaling.to_hf(self.rope_theta)
        d: dict[str, Any] = dict(
            architectures=[arch],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_parameters=rope,
            rope_scaling=None if self.rope_scaling.rope_type == "default" else rope,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            hidden_act="silu",
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            torch_dtype=self.param_dtype,
            dtype=self.param_dtype,
            attention_dropout=0.0,
            use_cache=True,
        )
        if self.model_type == "qwen2":
            if self.head_dim * self.num_heads != self.hidden_size:
                raise ValueError(
                    "qwen2 checkpoints derive head_dim = hidden_size / num_heads; "
                    "this config cannot be written as qwen2"
                )
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

    def _to_hf_vl_dict(self) -> dict:
        """transformers >= 5 layout: ``text_config`` (Qwen2 fields, M-RoPE sections in
        ``rope_parameters``) and ``vision_config`` nested under the VL model."""
        text = self.replace(model_type="qwen2", vision=None, mrope_section=()).to_hf_dict()
        for k in ("architectures", "torch_dtype", "dtype", "rope_scaling", "tie_word_embeddings"):
            text.pop(k, None)
        text["model_type"] = f"{self.model_type}_text"
        if self.mrope_section:
            text["rope_parameters"] = {
                **text["rope_parameters"],
                "mrope_section": list(self.mrope_section),
            }
        return dict(
            architectures=[VL_ARCHITECTURES[self.model_type]],
            model_type=self.model_type,
            text_config=text,
            vision_config=self.require_vision().to_hf_dict(),
            image_token_id=self.image_token_id,
            video_token_id=self.video_token_id,
            vision_start_token_id=self.vision_start_token_id,
            vision_end_token_id=self.vision_end_token_id,
            tie_word_embeddings=self.tie_word_embeddings,
            torch_dtype=self.param_dtype,
            dtype=self.param_dtype,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
        )
