"""Build and open a saved retrieval index folder.

Layout of ``out/``: ``meta.json`` (kind, document count, encoder), the document store
(:mod:`.corpus`), and the kind's own files (``bm25/`` or ``dense.faiss``).
"""
from __future__ import annotations

import json
import os
from typing import Protocol, Sequence

from .corpus import CorpusError, Document, read_corpus, write_doc_store

META_FILE = "meta.json"
KINDS = ("bm25", "dense")
FORMAT_VERSION = 1


class RetrievalIndexError(RuntimeError):
    """A missing, unreadable or inconsistent index folder."""


class Retriever(Protocol):
    kind: str

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top-``k`` ``(doc_index, score)`` per query, best first."""
        ...


def build_index(corpus: str, out: str, kind: str, encoder: str | None = None) -> dict:
    """Index the JSONL ``corpus`` into folder ``out``; returns the written metadata."""
    if kind not in KINDS:
        raise ValueError(f"--kind must be one of {KINDS}, got {kind!r}")
    docs: list[Document] = list(read_corpus(corpus))
    if not docs:
        raise CorpusError(f"corpus {corpus!r} has no documents")
    seen: set[str] = set()
    for d in docs:
        if d.id in seen:
            raise CorpusError(f"corpus {corpus!r}: duplicate id {d.id!r}; ids must be unique")
        seen.add(d.id)
    os.makedirs(out, exist_ok=True)
    write_doc_store(out, docs)
    meta: dict = {"format_version": FORMAT_VERSION, "kind": kind, "num_docs": len(docs)}
    if kind == "bm25":
        from .bm25_index import build_bm25

        build_bm25(docs, out)
    else:
        from .dense_index import build_dense
        from .encoder import DEFAULT_ENCODER

        meta["encoder"] = encoder or DEFAULT_ENCODER
        meta["dim"] = build_dense(docs, out, encoder)
    # meta.json last: its presence marks a complete index.
    with open(os.path.join(out, META_FILE), "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def read_meta(index_dir: str) -> dict:
    path = os.path.join(index_dir, META_FILE)
    if not os.path.isfile(path):
        raise RetrievalIndexError(
            f"{index_dir!r} is not a retrieval index (no {META_FILE}); build one with "
            f"`python -m tool_server.retrieval build --corpus c.jsonl --out {index_dir} "
            f"--kind bm25|dense`")
    with open(path) as f:
        meta = json.load(f)
    if meta.get("kind") not in KINDS:
        raise RetrievalIndexError(f"{path}: unknown kind {meta.get('kind')!r}; expected one of {KINDS}")
    return meta


def open_retriever(index_dir: str, meta: dict, encoder: str | None = None) -> Retriever:
    """Load the retriever of an index folder (memory-mapped)."""
    if meta["kind"] == "bm25":
        from .bm25_index import BM25Retriever

        return BM25Retriever(index_dir, meta["num_docs"])
    from .dense_index import DenseRetriever

    return DenseRetriever(index_dir, encoder or meta.get("encoder"))
