"""Weight sync: trainer params -> HF-named tensors -> a payload any engine can load.

The trainer's Flax params are turned into ``(hf_name, np.ndarray)`` pairs by the
models' name map (``verltool_jax.models.hf_io.hf_named_tensors``), so every engine that
reads HF checkpoints (vLLM, transformers) loads them with its own loader, in place.
``WeightPayload`` carries raw bytes plus dtype and shape: it crosses a process boundary
(vLLM's engine core) without pickling and without a disk round trip.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import numpy as np

# dtype names understood on both sides (numpy / ml_dtypes here, torch in the engine).
_SUPPORTED = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class WeightPayload:
    """HF-named tensors as raw bytes: ``names[i]`` has ``dtypes[i]``, ``shapes[i]``."""
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    buffers: tuple[bytes, ...]

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.buffers)


def _cast(arr: np.ndarray, dtype: Optional[str]) -> np.ndarray:
    if dtype is None:
        name = str(arr.dtype)
        if name not in _SUPPORTED:
            arr = arr.astype(np.float32)
        return arr
    if dtype not in _SUPPORTED:
        raise ValueError(f"weight sync dtype must be one of {_SUPPORTED}, got {dtype!r}")
    if dtype == "bfloat16":
        import ml_dtypes
        return arr.astype(ml_dtypes.bfloat16)
    return arr.astype(dtype)


def pack_named_tensors(named: Iterable[tuple[str, Any]],
                       dtype: Optional[str] = None) -> WeightPayload:
    """Pack ``(name, array)`` pairs (numpy / jax / ml_dtypes arrays) into a payload.

    ``dtype`` ("float32" | "bfloat16" | "float16") casts every tensor; None keeps each
    tensor's own dtype (anything else is sent as float32).
    """
    names, dtypes, shapes, bufs = [], [], [], []
    for name, arr in named:
        a = np.ascontiguousarray(_cast(np.asarray(arr), dtype))
        names.append(str(name))
        dtypes.append(str(a.dtype))
        shapes.append(tuple(int(s) for s in a.shape))
        bufs.append(a.tobytes())
    if not names:
        raise ValueError("weight sync got no tensors; check the params / name map")
    return WeightPayload(tuple(names), tuple(dtypes), tuple(shapes), tuple(bufs))


def payload_to_torch(names, dtypes, shapes, buffers) -> Iterator[tuple[str, Any]]:
    """Rebuild ``(name, torch.Tensor)`` pairs from a payload's fields (engine side)."""
    import torch
    tmap = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    for name, dt, shape, buf in zip(names, dtypes, shapes, buffers):
        if dt not in tmap:
            raise ValueError(f"weight {name!r}: unsupported dtype {dt!r}; use one of {_SUPPORTED}")
        t = torch.frombuffer(bytearray(buf), dtype=tmap[dt])
        yield name, t.reshape(tuple(shape))


def named_tensors_from_params(params: Any, config: Any) -> Iterator[tuple[str, np.ndarray]]:
    """Flax params (an ``nnx.State`` or the ``Transformer``) -> HF-named numpy arrays.

    Uses the models' single name/shape table, so the sampler never keeps its own copy
    of the parameter naming.
    """
    from verltool_jax.models.hf_io import hf_named_tensors
    for name, arr in hf_named_tensors(params, config):
        yield name, np.asarray(arr)
