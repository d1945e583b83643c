"""The offline web search backend: the local retrieval service over a corpus index."""

from __future__ import annotations

import os

from tool_server.retrieval.options import RetrievalOptions

from .backend import Result, SearchBackend, SearchError


class LocalBackend(SearchBackend):
    def __init__(self, options: RetrievalOptions) -> None:
        self.options = options

    @property
    def cache_id(self) -> str:
        return f"local:{os.path.abspath(self.options.index_dir or '')}"

    async def warm_up(self) -> None:
        await self.options.warm_up()

    async def search(self, query: str, k: int) -> list[Result]:
        try:
            hits = await self.options.service().search(query, k)
        except Exception as e:
            raise SearchError(f"local search failed: {e}") from e
        return [Result(title=h.title, link=f"local://{h.doc_id}", snippet=h.contents) for h in hits]
