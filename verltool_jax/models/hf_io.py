"""HF checkpoint import/export: ``load_hf``, ``save_hf``, ``hf_named_tensors``.

``load_hf`` builds the model abstractly (no weights allocated), then reads the safetensors
tensor by tensor from memory maps and places each straight into its target sharding:
with a mesh every device receives only its own slice (``jax.make_array_from_callback``),
so the host never holds the whole model, let alone twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .config import ModelConfig
from .name_maps import ParamMapping, canonical_hf_name, hf_to_path, param_table
from .safetensors_io import checkpoint_files, iter_tensors, write_file
from .transformer import Transformer
from .vision_language import model_class

# Tensors some HF checkpoints carry that are not parameters (recomputed from the config).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _key(p):
    if isinstance(p, jax.tree_util.DictKey):
        return p.key
    if isinstance(p, jax.tree_util.SequenceKey):
        return p.idx
    if isinstance(p, jax.tree_util.GetAttrKey):
        return p.name
    return p


def _flat_params(model_or_state) -> dict[tuple, Any]:
    """``{path tuple: array or Variable}`` of a module's params, an ``nnx.State`` or a plain
    nested dict (``nnx.to_pure_dict``)."""
    if isinstance(model_or_state, nnx.Module):
        model_or_state = nnx.state(model_or_state, nnx.Param)
    if isinstance(model_or_state, nnx.State):
        return {tuple(k): v for k, v in nnx.to_flat_state(model_or_state)}
    leaves = jax.tree_util.tree_flatten_with_path(model_or_state)[0]
    out = {}
    for kp, leaf in leaves:
        path = tuple(_key(p) for p in kp)
        out[path[:-1] if path and path[-1] == "value" else path] = leaf
    return out


def _value(leaf):
    return leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf


def _to_host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def hf_named_tensors(
    model_or_state, config: ModelConfig, contiguous: bool = True
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, numpy array)`` in HF layout for every parameter, one at a time.

    ``model_or_state``: a ``Transformer`` or its ``nnx.State`` of params (``nnx.split(model,
    nnx.Param)[1]``). Arrays keep the parameter dtype (bf16 as ``ml_dtypes.bfloat16``);
    Linear kernels are transposed to HF ``[out, in]``. With tied embeddings there is no
    ``lm_head.weight`` (HF and vLLM tie it themselves). ``contiguous=False`` yields
    transposed kernels as views (the consumer copies once, e.g. into shared memory).
    """
    from .lora import sampler_params

    if isinstance(model_or_state, nnx.Module) or isinstance(model_or_state, nnx.State):
        # LoRA adapters are folded into their kernels (the served weights); adapter
        # factors without a LoRA config are an error, never silently dropped.
        model_or_state = sampler_params(model_or_state, config)
    flat = _flat_params(model_or_state)
    for m in param_table(config):
        if m.path not in flat:
            raise KeyError(
                f"parameter {m.path} ({m.hf_name}) missing from the state; is the "
                f"config ({config.model_type}) the model's?"
            )
        arr = _to_host(_value(flat[m.path]))
        out = m.to_hf(arr)
        yield m.hf_name, np.ascontiguousarray(out) if contiguous else out


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(jnp.dtype(name))


def _place(arr: np.ndarray, m: ParamMapping, shape, dtype, mesh, rules) -> jax.Array:
    expected = m.hf_shape or (tuple(shape[::-1]) if m.transpose else tuple(shape))
    if tuple(arr.shape) != tuple(expected):
        raise ValueError(
            f"checkpoint tensor {m.hf_name} has shape {tuple(arr.shape)}, "
            f"expected {tuple(expected)} from config.json; the checkpoint and its "
            f"config disagree"
        )
    src = m.to_ours(arr)
    if mesh is None:
        return jnp.asarray(np.asarray(src, dtype=dtype))
    from jax.sharding import NamedSharding

    from ..sharding import param_spec

    sharding = NamedSharding(mesh, param_spec(m.path, shape, mesh, rules))
    return jax.make_array_from_callback(
        tuple(shape), sharding, lambda idx: np.ascontiguousarray(src[idx], dtype=dtype)
    )


def load_hf(
    path: str | os.PathLike,
    mesh=None,
    dtype: str | None = None,
    param_dtype: str | None = None,
    rules=None,
    **config_overrides,
) -> Transformer:
    """Load an HF checkpoint directory (``config.json`` + safetensors) as a ``Transformer``
    (a ``VisionLanguageModel`` for Qwen2.5-VL / Qwen2-VL checkpoints).

    ``dtype`` sets the compute dtype and, unless ``param_dtype`` is given, the parameter
    dtype too (e.g. ``"bfloat16"``); default float32. ``mesh``: place each parameter in its
    ``sharding.PARAM_RULES`` sharding while reading. ``config_overrides`` set other
    ``ModelConfig`` fields (e.g. ``remat_policy="full"``).
    """
    over = dtype_overrides(dtype, param_dtype, **config_overrides)
    cfg = ModelConfig.from_pretrained(path, **over)
    tensors = (nt for f in checkpoint_files(path) for nt in iter_tensors(f))
    return build_from_tensors(cfg, tensors, str(path), mesh=mesh, rules=rules)


def dtype_overrides(dtype: str | None, param_dtype: str | None = None, **over) -> dict:
    """``ModelConfig`` overrides for a load: ``dtype`` sets compute and (unless
    ``param_dtype`` is given) parameter dtype."""
    over = dict(over)
    if dtype is not None:
        over["dtype"] = dtype
        over.setdefault("param_dtype", dtype)
    if param_dtype is not None:
        over["param_dtype"] = param_dtype
    return over


def build_from_tensors(
    cfg: ModelConfig, tensors: Iterator[tuple[str, np.ndarray]], source: str, mesh=None, rules=None
) -> Transformer:
    """A ``Transformer`` of ``cfg`` whose parameters come from ``(hf_name, array)`` pairs in
    HF layout (read one at a time; each placed in its sharding as it arrives). Every
    parameter must arrive exactly once; ``source`` names the checkpoint in errors."""
    from ..sharding import PARAM_RULES

    rules = PARAM_RULES if rules is None else rules
    cls = model_class(cfg)
    abstract = nnx.eval_shape(lambda: cls(cfg, nnx.Rngs(0)))
    graphdef, abs_state = nnx.split(abstract)
    shapes = {k: _value(v) for k, v in _flat_params(abs_state).items()}
    table = hf_to_path(cfg)
    pdt = _np_dtype(cfg.param_dtype)
    loaded: dict[tuple, jax.Array] = {}
    unexpected = []
    for name, arr in tensors:
        if cfg.is_vision_language:
            name = canonical_hf_name(name)
        m = table.get(name)
        if m is None:
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue  # some tied checkpoints still store the copy
            if not name.endswith(_IGNORED_SUFFIXES):
                unexpected.append(name)
            continue
        loaded[m.path] = _place(arr, m, shapes[m.path].shape, pdt, mesh, rules)
    if unexpected:
        raise ValueError(
            f"{source}: tensors with no place in a {cfg.model_type} model: "
            f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )
    missing = [m.hf_name for m in table.values() if m.path not in loaded]
    if missing:
        raise ValueError(
            f"{source}: checkpoint lacks tensors {missing[:8]}{' ...' if len(missing) > 8 else ''}"
        )
    state = nnx.from_flat_state(
        {
            k: v.replace(loaded[k]) if isinstance(v, nnx.Variable) else loaded[k]
            for k, v in _flat_params(abs_state).items()
        }
    )
    return nnx.merge(graphdef, state)


def save_hf(
    model: Transformer, path: str | os.PathLike, tokenizer=None, max_shard_bytes: int = 5 * 2**30
) -> Path:
    """Write ``model`` as an HF checkpoint (config.json, safetensors, generation_config.json,
    and the tokenizer if given) that transformers and vLLM load. Tensors stream one at a
    time; files larger than ``max_shard_bytes`` are split with a ``model.safetensors.index.json``.
    """
    cfg: ModelConfig = model.config
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    flat = _flat_params(model)
    specs = []
    for m in param_table(cfg):
        v = _value(flat[m.path])
        shape = m.hf_shape or (tuple(v.shape[::-1]) if m.transpose else tuple(v.shape))
        specs.append((m.hf_name, tuple(shape), np.dtype(v.dtype)))
    shards: list[list] = [[]]
    size = 0
    for s in specs:
        n = int(np.prod(s[1])) * s[2].itemsize
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += n
    tensors = hf_named_tensors(model, cfg)
    if len(shards) == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for fname, shard in zip(names, shards):
        write_file(out / fname, shard, (next(tensors) for _ in shard))
        weight_map.update({s[0]: fname for s in shard})
    if len(shards) > 1:
        total = sum(int(np.prod(s[1])) * s[2].itemsize for s in specs)
        with open(out / "model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    hf = cfg.to_hf_dict()
    with open(out / "config.json", "w") as f:
        json.dump(hf, f, indent=2)
    gen = {
        k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if hf.get(k) is not None
    }
    with open(out / "generation_config.json", "w") as f:
        json.dump(gen, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
