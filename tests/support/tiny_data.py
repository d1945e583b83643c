"""Shared helpers of the data / task / reporting tests (imported by those test files)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    """The project's tiny BPE tokenizer (ChatML template), trained once per process."""
    from verltool_jax.models.tiny import build_tokenizer

    d = tempfile.mkdtemp(prefix="h8tok_")
    atexit.register(shutil.rmtree, d, True)
    return build_tokenizer(d)
