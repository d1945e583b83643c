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

import logging
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("verltool_jax.samplers")

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


def _cast(arr: np.ndarray, dtype: str | None) -> np.ndarray:
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


def pack_named_tensors(named: Iterable[tuple[str, Any]], dtype: str | None = None) -> WeightPayload:
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
    """Flax params (an ``nnx.State``, the ``Transformer`` or ``AdapterWeights``, merged)
    -> HF-named numpy arrays.

    Uses the models' single name/shape table, so the sampler never keeps its own copy
    of the parameter naming. Transposed kernels come as views: ``SharedWeightBuffer``
    transposes while it copies (one pass); ``pack_named_tensors`` makes them contiguous.
    """
    from verltool_jax.models.hf_io import hf_named_tensors
    from verltool_jax.models.lora import AdapterWeights

    if isinstance(params, AdapterWeights):  # an engine that serves no adapters: merged
        params = params.merged()
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


# vLLM's fused linear layers: ``<prefix>.<fused>.<weight|bias>`` holds the HF tensors
# ``<prefix>.<part>.<weight|bias>`` stacked along the output dim, in this order (the
# ``packed_modules_mapping`` of vLLM's llama / qwen2 / qwen3 / mistral models; the engine
# checks it against the model it runs before using a fused entry).
VLLM_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _layout(a) -> str:
    """ "t" for a 2-D array that is the transposed view of a C-contiguous array (a Flax
    ``[in, out]`` kernel seen in HF ``[out, in]`` layout): stored as that array, so writing
    it is a plain row copy; "hf" otherwise (stored as is)."""
    if (
        isinstance(a, np.ndarray)
        and a.ndim == 2
        and not a.flags.c_contiguous
        and a.T.flags.c_contiguous
        and min(a.shape) > 1
    ):
        return "t"
    return "hf"


def _fusion_groups(
    names: Sequence[str],
    arrays: Sequence[Any],
    layouts: Sequence[str],
    dtypes: Sequence[np.dtype],
    fuse: dict,
) -> dict[int, list[int]]:
    """``{index of a group's first part: [part indices]}`` for every complete group of
    ``fuse`` (same dtype, layout, ndim and trailing dims)."""
    index = {n: i for i, n in enumerate(names)}
    groups: dict[int, list[int]] = {}
    for i, name in enumerate(names):
        prefix, _, rest = name.rpartition(".")  # rest: weight | bias
        mod_prefix, _, short = prefix.rpartition(".")
        for _fused, parts in fuse.items():
            if short != parts[0]:
                continue
            found = [
                index.get(f"{mod_prefix}.{p}.{rest}" if mod_prefix else f"{p}.{rest}")
                for p in parts
            ]
            idx = [j for j in found if j is not None]
            if len(idx) < len(found):  # a part is missing: not a complete group
                continue
            shapes = [np.shape(arrays[j]) for j in idx]
            if (
                len({layouts[j] for j in idx}) == 1
                and len({dtypes[j] for j in idx}) == 1
                and len({len(sh) for sh in shapes}) == 1
                and len({tuple(sh[1:]) for sh in shapes}) == 1
            ):
                groups[i] = idx
    return groups


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_orphaned_segments(shm_dir: str | None = None) -> list[str]:
    """Delete the ``verltool-w-<pid>-...`` segments whose creating process has exited (a
    killed trainer never reaches :meth:`SharedWeightBuffer.close`; a SmolLM2 buffer is
    540 MB of RAM-backed ``/dev/shm``). Returns the removed paths."""
    d = shm_dir or SHM_DIR
    removed: list[str] = []
    try:
        names = os.listdir(d)
    except OSError:
        return removed
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != "verltool" or parts[1] != "w" or not parts[2].isdigit():
            continue
        if _pid_alive(int(parts[2])):
            continue
        try:
            os.unlink(os.path.join(d, name))
            removed.append(os.path.join(d, name))
        except OSError:
            pass
    return removed


class SharedWeightBuffer:
    """HF-named tensors written once into bucketed POSIX shared memory (``/dev/shm``).

    :meth:`write` casts each tensor straight into its slot (one copy per tensor, no
    intermediate bytes) and returns a JSON manifest, one entry per bucket: ``{"path",
    "tensors": [[name, dtype, shape, offset, layout, parts], ...]}``. ``shape`` is the
    HF (``[out, in]``) shape; ``layout`` "t" means the bytes hold its transpose (Flax
    kernels: written with a plain copy, no transpose pass); ``parts`` (``[[hf_name,
    rows], ...]``) marks a fused entry: the HF tensors of one vLLM layer (``fuse``, default
    :data:`VLLM_FUSED`: q/k/v -> ``qkv_proj``, gate/up -> ``gate_up_proj``) stacked along
    dim 0 under the fused name, laid out as the engine's layer holds them, so the engine
    loads it without assembling anything. An engine on the same host maps the files
    (``open_shared_entries`` / ``open_shared_tensors``): no pickling, no socket, no disk.
    Segments are reused across syncs (no fresh page faults) and removed by :meth:`close`.
    """

    def __init__(
        self, bucket_bytes: int = 256 << 20, prefix: str | None = None, fuse: dict | None = None
    ) -> None:
        import uuid

        self.bucket_bytes = int(bucket_bytes)
        self.prefix = prefix or f"verltool-w-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        gone = remove_orphaned_segments()
        if gone:
            log.info("removed %d shared-memory weight segment(s) of exited processes", len(gone))
        self.fuse = VLLM_FUSED if fuse is None else dict(fuse)
        self._maps: list[tuple[str, Any]] = []  # (path, np.memmap)
        self.nbytes = 0
        # what the last write laid out (entry names, dtypes, shapes, parts, buckets): a
        # write with the same layout may leave unchanged slots as they are
        self._layout_key: tuple | None = None
        self.full_manifest = ""  # every entry of the last write (a new engine's reload)
        self.written_bytes = 0  # bytes the last write copied (changed entries only)
        self.skipped: list[str] = []  # entries the last write found unchanged
        self.compare_seconds = 0.0  # of the last write, spent finding them
        self.trusted: list[str] = []  # of those, frozen ones checked on a first chunk only

    def _segment(self, k: int, size: int):
        path = os.path.join(SHM_DIR, f"{self.prefix}-{k}")
        if k < len(self._maps) and self._maps[k][1].size >= size:
            return self._maps[k]
        self._drop(k)
        m = np.memmap(path, dtype=np.uint8, mode="w+", shape=(max(size, 1),))
        self._maps.append((path, m))
        return self._maps[k]

    def write(
        self,
        named: Iterable[tuple[str, Any]],
        dtype: str | None = None,
        skip_unchanged: bool = False,
        frozen: Collection[str] = (),
    ) -> str:
        """Write ``(name, array)`` pairs (cast to ``dtype`` as in ``pack_named_tensors``);
        returns the manifest (JSON text).

        ``skip_unchanged``: when this write lays the entries out as the last one did, an
        entry whose bytes after the cast equal its slot's bitwise (:func:`same_bits`) is
        neither written nor put in the returned manifest (it lists the changed entries
        only; :attr:`skipped` names the others, :attr:`full_manifest` lists them all).
        This is exact: the slot holds what the last write put there, which is what an
        engine that loaded that write holds. Pass it only when the engine loaded the last
        write completely (the caller knows; a failed or partial load must not be followed
        by a skipping write).

        ``frozen``: names of source tensors the caller knows to be unchanged since the
        last write (the frozen base under LoRA: only the adapted kernels change). When
        skipping, an entry made only of them is compared on its first chunk alone
        (:func:`same_bits` with ``max_elements``, a guard against a broken promise)
        instead of in full; an entry whose first chunk differs is written as any changed
        entry. :attr:`trusted` names the entries skipped that way."""
        import json
        import time

        arrays = [(str(n), a) for n, a in named]
        if not arrays:
            raise ValueError("weight sync got no tensors; check the params / name map")
        if dtype is not None and dtype not in _SUPPORTED:
            raise ValueError(f"weight sync dtype must be one of {_SUPPORTED}, got {dtype!r}")
        names = [n for n, _ in arrays]
        srcs = [a if isinstance(a, np.ndarray) else np.asarray(a) for _, a in arrays]
        out_dt = []
        for a in srcs:
            src = str(np.dtype(a.dtype))
            out_dt.append(
                _np_dtype(dtype if dtype is not None else (src if src in _SUPPORTED else "float32"))
            )
        layouts = [_layout(a) for a in srcs]
        groups = _fusion_groups(names, srcs, layouts, out_dt, self.fuse) if self.fuse else {}
        in_group = {j for idx in groups.values() for j in idx}
        # entries: (name, [source indices], hf shape, layout, dtype)
        entries = []
        for i, name in enumerate(names):
            if i in groups:
                idx = groups[i]
                prefix, _, rest = name.rpartition(".")
                mod_prefix, _, short = prefix.rpartition(".")
                fused = next(f for f, p in self.fuse.items() if p[0] == short)
                fname = f"{mod_prefix}.{fused}.{rest}" if mod_prefix else f"{fused}.{rest}"
                rows = sum(srcs[j].shape[0] for j in idx)
                entries.append((fname, idx, (rows, *srcs[i].shape[1:]), layouts[i], out_dt[i]))
            elif i not in in_group:
                entries.append(
                    (name, [i], tuple(int(s) for s in srcs[i].shape), layouts[i], out_dt[i])
                )
        sizes = [int(np.prod(shape)) * dt.itemsize for _, _, shape, _, dt in entries]
        buckets = plan_buckets(sizes, self.bucket_bytes)
        key = (
            tuple(
                (name, [names[j] for j in idx], shape, layout, str(dt))
                for name, idx, shape, layout, dt in entries
            ),
            tuple(tuple(b) for b in buckets),
        )
        may_skip = skip_unchanged and key == self._layout_key
        frozen = frozenset(frozen)
        self._layout_key = None  # until this write is complete
        manifest, changed = [], []
        written, skipped, trusted, compare_s = 0, [], [], 0.0
        for k, bucket in enumerate(buckets):
            total = sum(_aligned(sizes[e]) for e in bucket)
            path, mem = self._segment(k, total)
            off, rows_out, rows_changed = 0, [], []
            for e in bucket:
                name, idx, shape, layout, dt = entries[e]
                stored = shape[::-1] if layout == "t" else shape
                view = mem[off : off + sizes[e]].view(dt).reshape(stored)
                slots = _part_slots(view, [srcs[j] for j in idx], layout)
                row = [name, str(dt), list(shape), off, layout, []]
                if len(idx) > 1:
                    row[5] = [[names[j], int(n)] for j, (_, _, n) in zip(idx, slots)]
                off += _aligned(sizes[e])
                rows_out.append(row)
                if may_skip:
                    t0 = time.perf_counter()
                    trust = all(names[j] in frozen for j in idx)
                    limit = _COMPARE_FIRST if trust else None
                    same = all(same_bits(dst, src, limit) for dst, src, _ in slots)
                    compare_s += time.perf_counter() - t0
                    if same:
                        skipped.append(name)
                        if trust:
                            trusted.append(name)
                        continue
                for dst, src, _ in slots:
                    np.copyto(dst, src, casting="unsafe")
                written += sizes[e]
                rows_changed.append(row)
            manifest.append({"path": path, "tensors": rows_out})
            if rows_changed:
                changed.append({"path": path, "tensors": rows_changed})
        self._drop(len(manifest))
        self.nbytes = sum(sizes)
        self.written_bytes, self.skipped, self.compare_seconds = written, skipped, compare_s
        self.trusted = trusted
        self.full_manifest = json.dumps(manifest)
        self._layout_key = key
        return json.dumps(changed) if may_skip else self.full_manifest

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


def _part_slots(view: np.ndarray, parts: Sequence[Any], layout: str) -> list[tuple]:
    """``(slot, source, rows)`` per HF tensor of one entry: the part of ``view`` (the
    entry's bytes as stored) that tensor fills and the source in the same layout (its
    transpose for layout "t": the part's columns of the stored ``[in, out]`` array)."""
    out, row = [], 0
    for a in parts:
        n = a.shape[0] if a.ndim else 1
        if layout == "t":
            out.append((view[:, row : row + n], a.T, n))
        elif a.ndim:
            out.append((view[row : row + n], a, n))
        else:
            out.append((view, a, n))
        row += n
    return out


# elements compared at a time: the first chunk is small (a changed tensor usually differs
# there, and costs no more), each next one twice as large, up to the cap
_COMPARE_FIRST, _COMPARE_CHUNK = 1 << 12, 1 << 20


def same_bits(dst: np.ndarray, src: Any, max_elements: int | None = None) -> bool:
    """Whether ``src`` cast to ``dst``'s dtype (as ``np.copyto(..., casting="unsafe")``
    writes it) is bitwise equal to ``dst``: the bit patterns are compared, so -0.0 differs
    from 0.0 and a NaN equals the same NaN. Compared in chunks of leading rows, so a
    tensor that changed is usually told apart by its first, small chunk.
    ``max_elements``: compare only the leading rows holding about that many elements
    (at least one row): a spot check for a tensor known to be unchanged."""
    src = np.asarray(src)
    if dst.shape != src.shape:
        return False
    if dst.size == 0:
        return True
    bits = np.dtype(f"u{dst.dtype.itemsize}")
    if dst.ndim == 0:
        return bool(np.asarray(src, dtype=dst.dtype).view(bits) == dst.view(bits))
    if (dst.shape[-1] * dst.dtype.itemsize) % 8 == 0:
        bits = np.dtype("u8")  # rows of whole 8-byte words: compared as such (faster)
    row = max(1, dst.size // max(1, dst.shape[0]))
    r, n = 0, min(_COMPARE_FIRST, _COMPARE_CHUNK, max_elements or _COMPARE_CHUNK)
    while r < dst.shape[0]:
        step = max(1, n // row)
        a, b = dst[r : r + step], src[r : r + step]
        b = b.astype(dst.dtype) if b.dtype != dst.dtype else b
        if bits.itemsize != dst.dtype.itemsize:  # a word view needs contiguous rows
            a = a if a.strides[-1] == a.itemsize else np.ascontiguousarray(a)
            b = b if b.strides[-1] == b.itemsize else np.ascontiguousarray(b)
        if not np.array_equal(a.view(bits), b.view(bits)):
            return False
        if max_elements is not None and (r + step) * row >= max_elements:
            return True
        r, n = r + step, min(2 * n, _COMPARE_CHUNK)
    return True


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclass
class SharedEntry:
    """One manifest entry mapped in the engine: ``stored`` is the tensor on the shared
    memory as written (the transpose of the HF tensor for layout "t"); ``parts`` are the
    HF tensors a fused entry stacks (``[[hf_name, rows], ...]``, empty otherwise)."""

    name: str
    shape: tuple[int, ...]
    layout: str
    parts: list
    stored: Any

    def hf(self):
        """The tensor in HF layout (a view; strided for layout "t")."""
        return self.stored.t() if self.layout == "t" else self.stored

    def hf_tensors(self) -> list[tuple[str, Any]]:
        """``(hf_name, view)`` of every HF tensor in this entry (the parts of a fused one)."""
        if not self.parts:
            return [(self.name, self.hf())]
        out, row, full = [], 0, self.hf()
        for name, n in self.parts:
            out.append((name, full[row : row + int(n)]))
            row += int(n)
        return out


def open_shared_entries(manifest: str, cache: dict | None = None) -> list[SharedEntry]:
    """Engine side: the entries of a :meth:`SharedWeightBuffer.write` manifest as torch
    tensors on the mapped shared memory (zero-copy; ``cache`` keeps the mappings open
    across syncs)."""
    import json
    import mmap

    import torch

    tmap = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    cache = {} if cache is None else cache
    out = []
    for bucket in json.loads(manifest):
        path = bucket["path"]
        size = os.path.getsize(path)
        mm = cache.get(path)
        if mm is None or len(mm) != size:
            with open(path, "r+b") as f:
                mm = mmap.mmap(f.fileno(), size)
            cache[path] = mm
        for row in bucket["tensors"]:
            name, dt, shape, off = row[:4]
            layout = row[4] if len(row) > 4 else "hf"
            parts = row[5] if len(row) > 5 else []
            if dt not in tmap:
                raise ValueError(
                    f"weight {name!r}: unsupported dtype {dt!r}; use one of {_SUPPORTED}"
                )
            shape = tuple(int(s) for s in shape)
            stored = shape[::-1] if layout == "t" else shape
            count = int(np.prod(shape)) if shape else 1
            t = torch.frombuffer(mm, dtype=tmap[dt], count=count, offset=int(off))
            out.append(SharedEntry(name, shape, layout, parts, t.reshape(stored)))
    return out


def open_shared_tensors(manifest: str, cache: dict | None = None) -> Iterator[tuple[str, Any]]:
    """Engine side: ``(hf_name, torch.Tensor)`` pairs in HF layout (views on the mapped
    shared memory, fused entries split into their parts) of a manifest."""
    for entry in open_shared_entries(manifest, cache):
        yield from entry.hf_tensors()


def log_sync_path(name: str, info: dict, logged: set) -> None:
    """Log which load a weight sync ran (``verltool_load_shared``'s reply): the first
    in-place sync at INFO, every new fallback reason as a WARNING."""
    key = (info.get("path"), info.get("reason"))
    if key in logged:
        return
    logged.add(key)
    if info.get("path") == "adapter":
        log.info("%s: weight sync of the LoRA adapter only (vLLM LoRA serving)", name)
    elif info.get("path") == "inplace":
        log.info(
            "%s: weight sync in place (%s tensors, %s packed GEMM weights rebuilt)",
            name,
            info.get("tensors"),
            info.get("repacked"),
        )
    else:
        log.warning(
            "%s: weight sync through vLLM's reload_weights (the slow layer-by-layer "
            "path), not in place: %s",
            name,
            info.get("reason"),
        )


def engine_sync_info(info: dict) -> dict:
    """The ``last_sync`` fields from ``verltool_load_shared``'s reply: ``sync_path``
    ("inplace" | "reload"), ``engine_load_seconds`` (the worker's own load) and, in place,
    its ``engine_copy_seconds`` (plain copies) / ``engine_repack_seconds`` (packed GEMM
    weights rebuilt, the LM head's included) / ``engine_repack_cpu_seconds``."""
    out = {"sync_path": info.get("path"), "engine_load_seconds": info.get("seconds")}
    for k in ("copy_seconds", "repack_seconds", "repack_cpu_seconds", "adapters"):
        if k in info:
            out["engine_" + k] = info[k]
    return out


def shared_memory_sync_info(buf: SharedWeightBuffer) -> dict:
    """The ``last_sync`` fields of a :class:`SharedWeightBuffer` write: ``written_bytes``
    (the changed entries' bytes; ``sync_bytes`` stays the whole payload),
    ``skipped_tensors`` (entries found unchanged and not sent; ``trusted_tensors`` of
    them frozen, spot-checked only) and ``compare_seconds``."""
    return {
        "written_bytes": buf.written_bytes,
        "skipped_tensors": len(buf.skipped),
        "trusted_tensors": len(buf.trusted),
        "compare_seconds": buf.compare_seconds,
    }
