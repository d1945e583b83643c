"""The retrieval service: a loaded index plus a batcher for concurrent queries.

``await service.search(query, k)`` from any number of concurrent tasks; queries that
arrive within ``max_wait_ms`` of each other are answered by one batched retrieval (one
encoder forward pass / one sparse matrix product) in the service's worker thread.
:func:`get_service` shares one service per index folder within a process, so every
tool that searches the same index uses the same memory-mapped files and the same batches.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from .batcher import AsyncBatcher
from .corpus import DocStore
from .index import open_retriever, read_meta


@dataclass(frozen=True)
class Hit:
    """One retrieved document, ``rank`` 1 for the best."""

    rank: int
    doc_id: str
    title: str
    contents: str
    score: float


class RetrievalService:
    def __init__(
        self,
        index_dir: str,
        encoder: str | None = None,
        max_wait_ms: float = 5.0,
        max_batch: int = 64,
    ) -> None:
        self.index_dir = os.path.abspath(index_dir)
        self.meta = read_meta(self.index_dir)
        self.kind: str = self.meta["kind"]
        self.docs = DocStore(self.index_dir)
        self._retriever = open_retriever(self.index_dir, self.meta, encoder)
        self._batcher: AsyncBatcher[tuple[str, int], list[Hit]] = AsyncBatcher(
            self._run_batch, max_wait_ms=max_wait_ms, max_batch=max_batch, name="retrieval"
        )

    @property
    def batch_sizes(self):
        """Sizes of the recent batches (how many queries each retrieval answered)."""
        return self._batcher.batch_sizes

    def search_batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Synchronous batched search: top-``k`` hits for each query."""
        if k < 1:
            raise ValueError(f"k (topk) must be >= 1, got {k}")
        rows = self._retriever.search_batch(queries, k)
        out = []
        for row in rows:
            hits = []
            for rank, (i, score) in enumerate(row, 1):
                d = self.docs[i]
                hits.append(Hit(rank, d.id, d.title, d.contents, score))
            out.append(hits)
        return out

    def _run_batch(self, items: list[tuple[str, int]]) -> list[list[Hit]]:
        kmax = max(k for _, k in items)
        rows = self.search_batch([q for q, _ in items], kmax)
        return [row[:k] for row, (_, k) in zip(rows, items)]

    async def search(self, query: str, k: int) -> list[Hit]:
        """Top-``k`` hits for one query, batched with concurrent callers."""
        if k < 1:
            raise ValueError(f"k (topk) must be >= 1, got {k}")
        return await self._batcher.submit((query, k))

    def close(self) -> None:
        self._batcher.close()
        self.docs.close()


_services: dict[tuple, RetrievalService] = {}
_services_lock = threading.Lock()


def get_service(
    index_dir: str, encoder: str | None = None, max_wait_ms: float = 5.0, max_batch: int = 64
) -> RetrievalService:
    """The process-wide service for ``index_dir`` (opened on first use)."""
    key = (os.path.abspath(index_dir), encoder, float(max_wait_ms), int(max_batch))
    with _services_lock:
        svc = _services.get(key)
        if svc is None:
            svc = _services[key] = RetrievalService(index_dir, encoder, max_wait_ms, max_batch)
        return svc
