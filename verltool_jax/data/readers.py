"""Read and write rows as parquet (the verl layout) or JSONL, validating every row.

``read_rows(path)`` returns plain Python dicts (nested parquet structs become dicts and
lists), each checked by :func:`verltool_jax.data.rows.validate_row`; a JSONL line that is
not JSON is an error naming the file and line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from verltool_jax.data.rows import DataRowError, validate_row

FORMATS = ("auto", "parquet", "jsonl")


def detect_format(path: str | os.PathLike, fmt: str = "auto") -> str:
    """``parquet`` or ``jsonl``: ``fmt`` if given, else from the file suffix."""
    if fmt not in FORMATS:
        raise ValueError(f"data.format must be one of {list(FORMATS)}, got {fmt!r}")
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    raise ValueError(
        f"cannot tell the format of {str(path)!r} from its suffix; name it "
        ".parquet or .jsonl or set data.format"
    )


def _strip_nulls(value):
    """Parquet structs carry every field of every row (absent ones as None): drop them."""
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def read_raw(path: str | os.PathLike, fmt: str = "auto") -> list:
    """The rows of one file, unvalidated."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    kind = detect_format(path, fmt)
    if kind == "parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        for row in rows:  # only nested structs get the null fields of other rows
            for key in ("reward_model", "extra_info"):
                if isinstance(row.get(key), dict):
                    row[key] = _strip_nulls(row[key])
        return rows
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataRowError(
                    f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be one JSON object"
                ) from None
    return rows


def read_rows(
    path: str | os.PathLike, fmt: str = "auto", validate: Callable = validate_row
) -> list[dict]:
    """Read and validate every row of ``path`` (``validate(row, index, where)``)."""
    return [validate(row, i, str(path)) for i, row in enumerate(read_raw(path, fmt))]


def read_files(
    paths: Sequence[str | os.PathLike], fmt: str = "auto", validate: Callable = validate_row
) -> list[dict]:
    """The rows of several files, in order."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise ValueError("no data files given (set data.train_files)")
    out: list[dict] = []
    for p in paths:
        out.extend(read_rows(p, fmt, validate))
    return out


def write_rows(rows: Iterable[dict], path: str | os.PathLike, fmt: str = "auto") -> Path:
    """Write rows as parquet or JSONL (by suffix unless ``fmt``); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    if detect_format(path, fmt) == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
