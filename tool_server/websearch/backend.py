"""The web search backend interface."""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass


class SearchError(RuntimeError):
    """A search that failed (after retries); the message is safe to show the model."""


@dataclass(frozen=True)
class Result:
    """One search result."""

    title: str
    link: str
    snippet: str

    def to_json(self) -> dict:
        return asdict(self)


class SearchBackend(abc.ABC):
    """A search engine. ``cache_id`` identifies the backend (and its configuration) in
    cache keys, so two backends never share entries."""

    @property
    @abc.abstractmethod
    def cache_id(self) -> str: ...

    async def warm_up(self) -> None:  # noqa: B027 (an optional hook: the default does nothing)
        """Prepare for the first search (load an index...); the default does nothing."""

    @abc.abstractmethod
    async def search(self, query: str, k: int) -> list[Result]:
        """The top ``k`` results for ``query``; raises :class:`SearchError` on failure."""
