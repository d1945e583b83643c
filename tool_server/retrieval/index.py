"""Build and open a saved retrieval index folder.

Layout of ``out/``: ``meta.json`` (kind, document count, encoder, the corpus
fingerprint), the document store (:mod:`.corpus`), and the kind's own files (``bm25/``
or ``dense.faiss``). :func:`check_index` tells whether an index was built from the corpus
a config names (same fingerprint) before any work starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Protocol

from .corpus import CorpusError, Document, corpus_fingerprint, write_doc_store
from .sources import load_corpus_sources

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


def build_command(
    out: str = "<index folder>", kind: str = "bm25|dense", corpus: str = "<corpus file> ..."
) -> str:
    """The command line that builds an index (quoted in error messages)."""
    return f"python -m tool_server.retrieval build --corpus {corpus} --out {out} --kind {kind}"


def build_index(
    corpus: str | Sequence[str],
    out: str,
    kind: str,
    encoder: str | None = None,
    docs: Sequence[Document] | None = None,
    sources: dict | None = None,
) -> dict:
    """Index ``corpus`` (one file or several, in any layout of :mod:`.sources`, merged
    and deduplicated) into folder ``out``; returns the written metadata. ``docs`` (with
    its ``sources`` summary) skips reading when the caller already merged the files."""
    if kind not in KINDS:
        raise ValueError(f"--kind must be one of {KINDS}, got {kind!r}")
    paths = [corpus] if isinstance(corpus, str) else list(corpus)
    if docs is None:
        docs, sources = load_corpus_sources(paths)
    docs = list(docs)
    if not docs:
        raise CorpusError(f"corpus {paths} has no documents")
    os.makedirs(out, exist_ok=True)
    write_doc_store(out, docs)
    meta: dict = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "num_docs": len(docs),
        "corpus_fingerprint": corpus_fingerprint(docs),
        "corpus_files": [os.path.abspath(p) for p in paths],
    }
    if sources:
        meta["corpus_sources"] = sources
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
            f"`{build_command(index_dir)}`"
        )
    with open(path) as f:
        meta = json.load(f)
    if meta.get("kind") not in KINDS:
        raise RetrievalIndexError(
            f"{path}: unknown kind {meta.get('kind')!r}; expected one of {KINDS}"
        )
    return meta


def open_retriever(index_dir: str, meta: dict, encoder: str | None = None) -> Retriever:
    """Load the retriever of an index folder (memory-mapped)."""
    if meta["kind"] == "bm25":
        from .bm25_index import BM25Retriever

        return BM25Retriever(index_dir, meta["num_docs"])
    from .dense_index import DenseRetriever

    return DenseRetriever(index_dir, encoder or meta.get("encoder"))


def check_index(
    index_dir: str, corpus: str | Sequence[str], docs: Sequence[Document] | None = None
) -> dict:
    """The index's metadata, after checking that it exists and was built from exactly the
    documents of ``corpus`` (same fingerprint); a :class:`RetrievalIndexError` naming both
    and the command that rebuilds it otherwise."""
    paths = [corpus] if isinstance(corpus, str) else list(corpus)
    meta = read_meta(index_dir)
    if docs is None:
        docs, _ = load_corpus_sources(paths)
    want = corpus_fingerprint(docs)
    have = meta.get("corpus_fingerprint")
    if have != want:
        built_from = meta.get("corpus_files") or "an unrecorded corpus"
        raise RetrievalIndexError(
            f"the index {index_dir!r} was built from a different corpus ({built_from}, "
            f"fingerprint {str(have)[:12]}, {meta.get('num_docs')} documents) than the one "
            f"configured ({paths}, fingerprint {want[:12]}, {len(docs)} documents); rebuild "
            f"it with `{build_command(index_dir, meta['kind'], ' '.join(paths))}` or point "
            "the config at the index of this corpus"
        )
    return meta
