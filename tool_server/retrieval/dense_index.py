"""Dense retrieval: FAISS exact inner-product search over sentence embeddings.

Score of document d for query q: ``cos(e(q), e(d)) = <e(q), e(d)>`` with ``e`` the
L2-normalised sentence embedding (see :mod:`.encoder`). The flat index is written with
``faiss.write_index`` and read back memory-mapped. For a flat index that needs
``faiss.IO_FLAG_MMAP_IFC`` (faiss >= 1.9): plain ``IO_FLAG_MMAP`` only maps inverted
lists and would copy the whole embedding matrix into memory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import faiss

from .bm25_index import document_text
from .corpus import Document
from .encoder import encode, load_encoder

INDEX_FILE = "dense.faiss"


def mmap_read_flags() -> int:
    """The ``faiss.read_index`` flags that memory-map a flat index's vectors."""
    return getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) | faiss.IO_FLAG_READ_ONLY


def build_dense(
    docs: list[Document], out_dir: str, encoder: str | None = None, batch_size: int = 32
) -> int:
    """Embed ``docs`` and save a flat inner-product index; returns the embedding size."""
    model = load_encoder(encoder)
    get_dim = (
        getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    )
    dim = int(get_dim())
    index = faiss.IndexFlatIP(dim)
    for start in range(0, len(docs), 1024):
        chunk = docs[start : start + 1024]
        index.add(encode(model, [document_text(d) for d in chunk], batch_size))
    faiss.write_index(index, os.path.join(out_dir, INDEX_FILE))
    return dim


class DenseRetriever:
    """A loaded dense index (memory-mapped) and its query encoder."""

    kind = "dense"

    def __init__(self, index_dir: str, encoder: str | None) -> None:
        self._index = faiss.read_index(os.path.join(index_dir, INDEX_FILE), mmap_read_flags())
        self._model = load_encoder(encoder)

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top-``k`` ``(doc_index, cosine)`` per query, best first."""
        k = min(k, self._index.ntotal)
        if not queries or k <= 0:
            return [[] for _ in queries]
        scores, ids = self._index.search(encode(self._model, queries), k)
        return [
            [(int(i), float(s)) for i, s in zip(row_i, row_s) if i >= 0]
            for row_i, row_s in zip(ids, scores)
        ]
