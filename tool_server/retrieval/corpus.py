"""Corpus files and the memory-mapped document store of a saved index.

A corpus is a JSONL file, one document a line: ``{"id": str, "title": str,
"contents": str}`` (``id`` may be a number; it is kept as a string). An index folder
keeps its own copy of the documents as ``docs.jsonl`` plus ``doc_offsets.npy`` (the
byte offset of each line, and the file size last), so document ``i`` is the byte range
``offsets[i]:offsets[i+1]`` of a memory-mapped file and nothing is read into memory
until it is asked for.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

REQUIRED_FIELDS = ("id", "title", "contents")
DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "doc_offsets.npy"


class CorpusError(ValueError):
    """A corpus file or document that does not follow the JSONL layout."""


@dataclass(frozen=True)
class Document:
    """One corpus document."""

    id: str
    title: str
    contents: str

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, "contents": self.contents}


def document_from_dict(d: object, where: str = "document") -> Document:
    """Validate one corpus record; the error names the missing or mistyped field."""
    if not isinstance(d, dict):
        raise CorpusError(
            f"{where}: expected a JSON object with fields {REQUIRED_FIELDS}, got {type(d).__name__}"
        )
    missing = [f for f in REQUIRED_FIELDS if f not in d]
    if missing:
        raise CorpusError(
            f"{where}: missing field(s) {missing}; every line needs "
            f"'id', 'title' and 'contents' (use '' for an unknown title)"
        )
    if not isinstance(d["id"], (str, int)):
        raise CorpusError(
            f"{where}: field 'id' must be a string or integer, got {type(d['id']).__name__}"
        )
    for f in ("title", "contents"):
        if not isinstance(d[f], str):
            raise CorpusError(f"{where}: field {f!r} must be a string, got {type(d[f]).__name__}")
    return Document(id=str(d["id"]), title=d["title"], contents=d["contents"])


def read_corpus(path: str) -> Iterator[Document]:
    """Yield the documents of a JSONL corpus, validating each line (blank lines skipped)."""
    if not os.path.isfile(path):
        raise CorpusError(f"corpus file {path!r} does not exist; pass --corpus <file.jsonl>")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{where}: not valid JSON ({e.msg})") from None
            yield document_from_dict(record, where)


def write_corpus(path: str, docs: Iterable[Document | dict]) -> int:
    """Write documents as JSONL; returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            doc = d if isinstance(d, Document) else document_from_dict(d)
            f.write(json.dumps(doc.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


def corpus_fingerprint(docs: Iterable[Document]) -> str:
    """``sha256`` over the documents in order, each as ``id \x1f title \x1f contents \x1e``:
    equal exactly when two corpora have the same documents in the same order (the order
    matters: an index refers to documents by position)."""
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{d.id}\x1f{d.title}\x1f{d.contents}\x1e".encode())
    return h.hexdigest()


def write_doc_store(out_dir: str, docs: list[Document]) -> None:
    """Write ``docs.jsonl`` and ``doc_offsets.npy`` into ``out_dir``."""
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    with open(os.path.join(out_dir, DOCS_FILE), "wb") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps(doc.to_json(), ensure_ascii=False).encode("utf-8") + b"\n")
            offsets[i + 1] = f.tell()
    np.save(os.path.join(out_dir, OFFSETS_FILE), offsets)


class DocStore:
    """Read-only, memory-mapped access to the documents of an index folder."""

    def __init__(self, index_dir: str) -> None:
        docs_path = os.path.join(index_dir, DOCS_FILE)
        self._offsets = np.load(os.path.join(index_dir, OFFSETS_FILE), mmap_mode="r")
        self._file = open(docs_path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        # mmap of an empty file is an error; an empty store simply has no documents.
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> Document:
        if not 0 <= i < len(self):
            raise IndexError(f"document index {i} out of range [0, {len(self)})")
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        assert self._mm is not None
        return document_from_dict(json.loads(self._mm[start:end]))

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
        self._file.close()
