"""Sparse retrieval: Okapi BM25 with the ``bm25s`` library.

Score of document d for query q (bm25s, method "lucene"):
``sum_{t in q} idf(t) * tf(t,d) * (k1 + 1) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))``
with ``idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))``. Text is lower-cased, split on
``\\w\\w+`` and English stop words are removed, identically at build and query time.
The saved score matrix is memory-mapped when loaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import bm25s

from .corpus import Document

SUBDIR = "bm25"
STOPWORDS = "en"


def _tokenize(texts: Sequence[str]) -> list[list[str]]:
    return bm25s.tokenize(
        list(texts), lower=True, stopwords=STOPWORDS, return_ids=False, show_progress=False
    )


def document_text(doc: Document) -> str:
    """The text a document is indexed by: its title followed by its contents."""
    return f"{doc.title}\n{doc.contents}" if doc.title else doc.contents


def build_bm25(docs: list[Document], out_dir: str, k1: float = 1.5, b: float = 0.75) -> None:
    """Index ``docs`` and save the score matrix under ``out_dir/bm25``."""
    tokens = bm25s.tokenize(
        [document_text(d) for d in docs], lower=True, stopwords=STOPWORDS, show_progress=False
    )
    model = bm25s.BM25(k1=k1, b=b)
    model.index(tokens, show_progress=False)
    model.save(os.path.join(out_dir, SUBDIR), show_progress=False)


class BM25Retriever:
    """A loaded BM25 index (memory-mapped). Not thread-safe: use from one thread."""

    kind = "bm25"

    def __init__(self, index_dir: str, num_docs: int) -> None:
        self._model = bm25s.BM25.load(
            os.path.join(index_dir, SUBDIR), mmap=True, show_progress=False
        )
        self._num_docs = num_docs

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top-``k`` ``(doc_index, score)`` per query, best first; only documents that
        share at least one term with the query (score > 0) are returned."""
        k = min(k, self._num_docs)
        if not queries or k <= 0:
            return [[] for _ in queries]
        docs, scores = self._model.retrieve(
            _tokenize(queries), k=k, show_progress=False, n_threads=0
        )
        return [
            [(int(i), float(s)) for i, s in zip(row_d, row_s) if s > 0.0]
            for row_d, row_s in zip(docs, scores)
        ]
