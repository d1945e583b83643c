"""Weight sync: trainer params -> HF-named tensors -> a payload any engine can load.

The trainer's Flax params are turned into ``(hf_name, np.ndarray)`` pairs by the
models' name map (``verltool_jax.models.hf_io.hf_named_tensors``), so every engine that
reads HF checkpoints (vLLM, transformers) loads them with its own loader, in place.
``WeightPayload`` carries raw bytes plus dtype and shape: it crosses a process boundary
(vLLM's engine core) without pickling and without a disk round trip.

``SharedWeightBuffer`` is the fast path to any engine on the same host (an in-process
engine core or a local ``vllm serve``): the tensors are written once into bucketed
shared memory and the engine's worker maps them (``open_shared_tensors``), so one
sync costs about one memcpy of the payload plus the engine's own weight loading; only
the manifest (names, dtypes, shapes, offsets) crosses the process boundary.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Sequence

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
    of the parameter naming. Transposed kernels come as views: ``SharedWeightBuffer``
    transposes while it copies (one pass); ``pack_named_tensors`` makes them contiguous.
    """
    from verltool_jax.models.hf_io import hf_named_tensors
    for name, arr in hf_named_tensors(params, config, contiguous=False):
        yield name, np.asarray(arr)


# ------------------------------------------------------------------ shared memory
_ALIGN = 64
SHM_DIR = "/dev/shm"


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Greedy bucketing: tensor indices in order, a new bucket when the next tensor would
    take the current one past ``bucket_bytes`` (a tensor larger than a bucket gets one of
    its own). Offsets inside a bucket are ``_ALIGN``-byte aligned."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[int]] = []
    used = 0
    for i, n in enumerate(sizes):
        if not buckets or (used and used + _aligned(n) > bucket_bytes):
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += _aligned(n)
    return buckets


class SharedWeightBuffer:
    """HF-named tensors written once into bucketed POSIX shared memory (``/dev/shm``).

    :meth:`write` casts each tensor straight into its slot (one copy per tensor, no
    intermediate bytes) and returns a JSON manifest ``[{"path", "tensors": [[name, dtype,
    shape, offset], ...]}, ...]`` (one entry per bucket). An engine on the same host maps
    the files and builds its tensors on the mapped memory (``open_shared_tensors``): no
    pickling, no socket, no disk. Segments are reused across syncs (no fresh page faults)
    and removed by :meth:`close`.
    """

    def __init__(self, bucket_bytes: int = 256 << 20, prefix: Optional[str] = None) -> None:
        import uuid
        self.bucket_bytes = int(bucket_bytes)
        self.prefix = prefix or f"verltool-w-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._maps: list[tuple[str, Any]] = []        # (path, np.memmap)
        self.nbytes = 0

    def _segment(self, k: int, size: int):
        path = os.path.join(SHM_DIR, f"{self.prefix}-{k}")
        if k < len(self._maps) and self._maps[k][1].size >= size:
            return self._maps[k]
        self._drop(k)
        m = np.memmap(path, dtype=np.uint8, mode="w+", shape=(max(size, 1),))
        self._maps.append((path, m))
        return self._maps[k]

    def write(self, named: Iterable[tuple[str, Any]], dtype: Optional[str] = None) -> str:
        """Write ``(name, array)`` pairs (cast to ``dtype`` as in ``pack_named_tensors``);
        returns the manifest (JSON text)."""
        import json
        arrays = [(str(n), a) for n, a in named]
        if not arrays:
            raise ValueError("weight sync got no tensors; check the params / name map")
        out_dt = []
        for _, a in arrays:
            src = np.dtype(getattr(a, "dtype", np.float32))
            if dtype is not None:
                if dtype not in _SUPPORTED:
                    raise ValueError(f"weight sync dtype must be one of {_SUPPORTED}, got "
                                     f"{dtype!r}")
                name = dtype
            else:
                name = str(src) if str(src) in _SUPPORTED else "float32"
            out_dt.append(_np_dtype(name))
        sizes = [int(np.prod(np.shape(a))) * dt.itemsize for (_, a), dt in zip(arrays, out_dt)]
        manifest = []
        for k, idx in enumerate(plan_buckets(sizes, self.bucket_bytes)):
            total = sum(_aligned(sizes[i]) for i in idx)
            path, mem = self._segment(k, total)
            off, entries = 0, []
            for i in idx:
                name, a = arrays[i]
                shape = tuple(int(s) for s in np.shape(a))
                view = mem[off:off + sizes[i]].view(out_dt[i]).reshape(shape)
                np.copyto(view, np.asarray(a), casting="unsafe")
                entries.append([name, str(out_dt[i]), list(shape), off])
                off += _aligned(sizes[i])
            manifest.append({"path": path, "tensors": entries})
        self._drop(len(manifest))
        self.nbytes = sum(sizes)
        return json.dumps(manifest)

    def _drop(self, start: int) -> None:
        """Unmap and remove segments ``start ...``."""
        for path, _ in self._maps[start:]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        del self._maps[start:]

    def close(self) -> None:
        self._drop(0)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def open_shared_tensors(manifest: str, cache: Optional[dict] = None
                        ) -> Iterator[tuple[str, Any]]:
    """Engine side: ``(name, torch.Tensor)`` pairs on the mapped shared memory of a
    :meth:`SharedWeightBuffer.write` manifest (zero-copy; ``cache`` keeps the mappings
    open across syncs)."""
    import json
    import mmap

    import torch
    tmap = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    cache = {} if cache is None else cache
    for bucket in json.loads(manifest):
        path = bucket["path"]
        size = os.path.getsize(path)
        mm = cache.get(path)
        if mm is None or len(mm) != size:
            with open(path, "r+b") as f:
                mm = mmap.mmap(f.fileno(), size)
            cache[path] = mm
        for name, dt, shape, off in bucket["tensors"]:
            if dt not in tmap:
                raise ValueError(f"weight {name!r}: unsupported dtype {dt!r}; use one of "
                                 f"{_SUPPORTED}")
            count = int(np.prod(shape)) if shape else 1
            t = torch.frombuffer(mm, dtype=tmap[dt], count=count, offset=int(off))
            yield name, t.reshape(tuple(shape))
