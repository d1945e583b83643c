"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A targeted linear layer ``y = x W (+ b)`` with ``W [in, out]`` gets two trainable factors
``A [in, r]`` and ``B [r, out]``:

    y = x W + s * (x A) B,        s = alpha / r

``B`` starts at zero (the adapted model equals the base model at step 0) and ``A`` at
``U(-1/sqrt(in), 1/sqrt(in))``. Only ``A`` and ``B`` train (``nnx.LoRAParam``, a subclass
of ``nnx.Param``); the base weights are frozen. The samplers and HF exports never see the
factors: they get the merged weight ``W' = W + s * A B`` (:func:`fold_lora`), so the
served model computes exactly what the trainer's unmerged forward computes, up to float
rounding.

Adapters go on the modules named in ``ModelConfig.lora_targets`` (``q_proj``, ``k_proj``,
``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``) of the last
``lora_last_layers`` decoder layers (0: all). With adapters only in the top layers the
backward pass stops at the lowest adapted layer, which is what makes a 135M-parameter model
trainable on two CPU cores.

Where we differ from PEFT on purpose: no dropout on the adapter input (RL updates are
small and on-policy), and ``A`` is drawn uniform with the fan-in bound directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_LEAVES = ("lora_a", "lora_b")
# The ModelConfig fields that describe the adapters.
LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_targets", "lora_last_layers")


class LoRALinear(nnx.Linear):
    """``nnx.Linear`` plus ``lora_a [in, r]`` and ``lora_b [r, out]`` (``nnx.LoRAParam``):
    ``y = x W (+ b) + scale * (x A) B`` (module docstring). The base kernel keeps its
    path (``.../kernel``), so HF name maps and checkpoints of the base model still apply."""

    def __init__(
        self, din: int, dout: int, *, rank: int, scale: float, rngs: nnx.Rngs, **linear_kw: Any
    ):
        super().__init__(din, dout, rngs=rngs, **linear_kw)
        bound = 1.0 / float(din) ** 0.5
        pdt = self.kernel[...].dtype
        self.lora_a = nnx.LoRAParam(
            jax.random.uniform(rngs.params(), (din, rank), pdt, -bound, bound)
        )
        self.lora_b = nnx.LoRAParam(jnp.zeros((rank, dout), pdt))
        self.lora_scale = float(scale)

    def __call__(self, x: jax.Array, out_sharding=None) -> jax.Array:
        """``Linear(x) + lora_scale * (x @ A) @ B`` (``out_sharding`` applies to the first)."""
        y = super().__call__(x, out_sharding)
        a = self.lora_a[...].astype(y.dtype)
        b = self.lora_b[...].astype(y.dtype)
        return y + self.lora_scale * ((x.astype(y.dtype) @ a) @ b)


def lora_layer_ids(config) -> frozenset[int]:
    """The decoder layers that carry adapters: the last ``lora_last_layers`` (0: all)."""
    n = config.num_layers
    k = config.lora_last_layers or n
    return frozenset(range(max(0, n - k), n))


def wants_lora(config, layer: int, module: str) -> bool:
    """Whether ``layers/<layer>/.../<module>`` gets an adapter under ``config``."""
    return (
        config.lora_rank > 0 and module in config.lora_targets and layer in lora_layer_ids(config)
    )


def trainable_filter(config):
    """The nnx filter of the parameters that train: the adapters with LoRA, else all."""
    return nnx.LoRAParam if getattr(config, "lora_rank", 0) > 0 else nnx.Param


def _flat(state: nnx.State) -> dict[tuple, Any]:
    return {tuple(k): v for k, v in nnx.to_flat_state(state)}


def has_lora(state: nnx.State) -> bool:
    """Whether a param state holds adapter factors."""
    return any(k and k[-1] in LORA_LEAVES for k in _flat(state))


def fold_lora(params: nnx.State, scale: float) -> nnx.State:
    """The param state with every adapter merged into its kernel and the factors dropped:
    ``kernel' = kernel + scale * lora_a @ lora_b`` (in the kernel's dtype, product in
    float32). A state without adapters is returned as it is."""
    flat = _flat(params)
    if not any(k and k[-1] in LORA_LEAVES for k in flat):
        return params
    out = {}
    for k, v in flat.items():
        if k and k[-1] in LORA_LEAVES:
            continue
        if _adapted(flat, k):
            a, b = _value(flat[k[:-1] + ("lora_a",)]), _value(flat[k[:-1] + ("lora_b",)])
            merged = _fold_kernel(_value(v), a, b, jnp.float32(scale))
            v = v.replace(merged) if isinstance(v, nnx.Variable) else merged
        out[k] = v
    return nnx.from_flat_state(out)


@jax.jit
def _fold_kernel(w: jax.Array, a: jax.Array, b: jax.Array, scale: jax.Array) -> jax.Array:
    """``w + scale * a @ b`` in float32, cast to ``w``'s dtype: one compiled program per
    kernel shape, which writes the merged kernel once (eagerly, the product, its scaled
    copy and the sum are three full-size arrays; a weight sync folds 56 kernels)."""
    f32 = jnp.float32
    return (w.astype(f32) + scale * (a.astype(f32) @ b.astype(f32))).astype(w.dtype)


def _adapted(flat: dict, path: tuple) -> bool:
    """Whether ``path`` of the flat param state is a kernel with LoRA factors beside it."""
    return bool(path) and path[-1] == "kernel" and path[:-1] + ("lora_a",) in flat


def _value(v):
    return v.get_value() if isinstance(v, nnx.Variable) else v


def sampler_params(model_or_state, config=None) -> nnx.State:
    """What the samplers and exports get: the param state with adapters folded in (a
    module's own config says how; a bare state needs the trainer's ``config``)."""
    if isinstance(model_or_state, nnx.Module):  # a module knows its own adapters
        config = model_or_state.config  # type: ignore[attr-defined]  # every policy model has one
        model_or_state = nnx.state(model_or_state, nnx.Param)
    if config is None or getattr(config, "lora_rank", 0) == 0:
        if has_lora(model_or_state):
            raise ValueError(
                "the param state has LoRA factors but the config has lora_rank=0; "
                "pass the trainer's ModelConfig to fold them"
            )
        return model_or_state
    return fold_lora(model_or_state, config.lora_scale)


def with_lora(
    model,
    rank: int,
    alpha: float,
    targets: Iterable[str] = LORA_TARGETS,
    last_layers: int = 0,
    seed: int = 0,
):
    """``model`` (a loaded ``Transformer``) rebuilt with adapters on ``targets`` of the last
    ``last_layers`` layers (0: all), the base weights copied in, ``B = 0`` (so its outputs
    are unchanged). ``rank`` 0 returns ``model``."""
    if rank <= 0:
        return model
    targets = tuple(targets)
    bad = [t for t in targets if t not in LORA_TARGETS]
    if bad or not targets:
        raise ValueError(f"model.lora_targets {targets!r}: each must be one of {LORA_TARGETS}")
    if model.config.is_vision_language:
        raise ValueError(
            "model.lora_rank > 0 is supported for text models only "
            f"(got model_type {model.config.model_type!r})"
        )
    cfg = model.config.replace(
        lora_rank=int(rank),
        lora_alpha=float(alpha),
        lora_targets=targets,
        lora_last_layers=int(last_layers),
    )
    new = type(model)(cfg, nnx.Rngs(seed))
    base = nnx.state(model, nnx.Param)
    nnx.update(new, base)
    return new


# ------------------------------------------------------------------ adapter-only sync
def strip_lora(params: nnx.State) -> nnx.State:
    """The param state without its adapter factors: the frozen base model."""
    return nnx.from_flat_state(
        {k: v for k, v in _flat(params).items() if not (k and k[-1] in LORA_LEAVES)}
    )


@dataclass(frozen=True)
class AdapterWeights:
    """The policy as the frozen base plus its LoRA adapters, for samplers that apply the
    adapters themselves (``sampler.lora_sync="adapter"``): vLLM's LoRA serving, the JAX
    sampler. ``params`` is the trainer's unfolded param state (base kernels and
    ``lora_a`` / ``lora_b``), ``config`` its ``ModelConfig`` (rank, alpha, targets).
    A sampler that cannot apply adapters serves :meth:`merged`, the same function.
    A pytree (``config`` static), so multi-host gathers and device puts go through it."""

    params: Any
    config: Any

    def merged(self) -> nnx.State:
        """``W' = W + s A B`` folded into every adapted kernel (:func:`fold_lora`)."""
        return fold_lora(self.params, self.config.lora_scale)

    def base(self) -> nnx.State:
        """The frozen base model (:func:`strip_lora`)."""
        return strip_lora(self.params)

    def frozen_hf_names(self) -> frozenset[str]:
        """HF names of the served tensors that training cannot change: every one but the
        adapted kernels (only the adapters train, so the merged weights differ from the
        base there alone). A weight sync may skip comparing these in full."""
        from .name_maps import param_table

        flat = _flat(self.params)
        return frozenset(m.hf_name for m in param_table(self.config) if not _adapted(flat, m.path))

    def peft_tensors(self) -> list[tuple[str, np.ndarray]]:
        """The adapters as a PEFT checkpoint holds them, in HF layout:
        ``base_model.model.<hf module>.lora_A.weight = A^T [r, in]`` and
        ``...lora_B.weight = B^T [out, r]``; PEFT's scaling ``lora_alpha / r`` is ours, so
        the served layer computes ``x W^T + (alpha / r) (x A) B`` as the trainer does."""
        from .name_maps import param_table

        flat = _flat(self.params)
        out = []
        for m in param_table(self.config):
            stem = m.path[:-1]
            if not _adapted(flat, m.path):
                continue
            hf = "base_model.model." + m.hf_name.removesuffix(".weight")
            a = np.asarray(_value(flat[stem + ("lora_a",)]))
            b = np.asarray(_value(flat[stem + ("lora_b",)]))
            out += [(f"{hf}.lora_A.weight", a.T), (f"{hf}.lora_B.weight", b.T)]
        if not out:
            raise ValueError("AdapterWeights: the param state holds no LoRA factors")
        return out

    def peft_config(self) -> dict:
        """``adapter_config.json`` of a PEFT LoRA checkpoint with these adapters."""
        c = self.config
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": int(c.lora_rank),
            "lora_alpha": float(c.lora_alpha),
            "target_modules": sorted(c.lora_targets),
            "lora_dropout": 0.0,
            "bias": "none",
            "use_rslora": False,
            "fan_in_fan_out": False,
        }

    def save_peft(self, path: str | os.PathLike, dtype: str | None = None) -> int:
        """Write the adapters as a PEFT checkpoint directory (``adapter_config.json``,
        ``adapter_model.safetensors``; ``dtype`` casts, None keeps float32); each file is
        written beside its name and renamed over it, so a reader never sees half a file.
        Returns the tensor bytes written."""
        from .safetensors_io import write_file

        d = Path(path)
        d.mkdir(parents=True, exist_ok=True)
        named = [(n, np.ascontiguousarray(_cast_np(a, dtype))) for n, a in self.peft_tensors()]
        tmp = d / ".adapter_model.safetensors.tmp"
        write_file(tmp, [(n, a.shape, a.dtype) for n, a in named], named)
        os.replace(tmp, d / "adapter_model.safetensors")
        tmp = d / ".adapter_config.json.tmp"
        tmp.write_text(json.dumps(self.peft_config()))
        os.replace(tmp, d / "adapter_config.json")
        return sum(a.nbytes for _, a in named)


def _cast_np(a: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or dtype == "float32":
        return a.astype(np.float32, copy=False)
    return a.astype(jnp.dtype(dtype))


jax.tree_util.register_dataclass(AdapterWeights, data_fields=["params"], meta_fields=["config"])
