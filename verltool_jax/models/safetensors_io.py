"""Streaming safetensors reader/writer on numpy (bf16 via ``ml_dtypes``).

Format: 8-byte little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then
the raw little-endian tensor bytes (offsets relative to the end of the header).
Reading memory-maps the file, so one tensor (or one slice of it) is read at a time.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
NAMES = {v: k for k, v in DTYPES.items()}


def read_header(path: str | Path) -> tuple[dict, int]:
    """``(header dict, byte offset of the data section)``."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header, 8 + n


def iter_tensors(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(name, array)`` of one file; arrays are read-only memory-mapped views."""
    header, start = read_header(path)
    header.pop("__metadata__", None)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in header.items():
        if info["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        arr = mm[start + b : start + e].view(DTYPES[info["dtype"]]).reshape(info["shape"])
        yield name, arr


def checkpoint_files(ckpt_dir: str | os.PathLike) -> list[Path]:
    """The safetensors files of an HF checkpoint (sharded via ``model.safetensors.index.json``)."""
    d = Path(ckpt_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        return [d / f for f in files]
    single = d / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(d.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"no *.safetensors in {d}; only safetensors checkpoints load")
    return found


def write_file(
    path: str | Path,
    specs: list[tuple[str, tuple, np.dtype]],
    tensors: Iterable[tuple[str, np.ndarray]],
) -> None:
    """Write ``tensors`` (in the order of ``specs``: name, shape, dtype) to one file, streaming."""
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape, dt in specs:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        header[name] = {
            "dtype": NAMES[np.dtype(dt)],
            "shape": list(shape),
            "data_offsets": [off, off + n],
        }
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    expected = [s[0] for s in specs]
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for k, (name, arr) in enumerate(tensors):
            if k >= len(expected) or name != expected[k]:
                raise RuntimeError(f"tensor order mismatch writing {path}: got {name!r}")
            info = header[name]
            arr = np.ascontiguousarray(arr, dtype=DTYPES[info["dtype"]])
            if list(arr.shape) != info["shape"]:
                raise RuntimeError(f"{name}: shape {arr.shape} != planned {info['shape']}")
            f.write(arr.tobytes())
