"""The mechanism shared by the ``<search>`` tools (``search_retrieval``, ``web_search``):
action parsing, the empty-query observation and :class:`QuerySearchTool`, their common
base. Not a tool: ``_`` files are skipped."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from tool_server.kit.base import BaseTool, Observation
from tool_server.kit.observations import invalid_observation
from tool_server.kit.search_format import format_information, format_no_results
from tool_server.kit.tags import last_tag_body

log = logging.getLogger(__name__)


def parse_query_action(action: str, tag: str) -> tuple[str | None, bool]:
    """``parse_action`` of a ``<tag>query</tag>`` tool: ``(query, True)`` with the body of
    the last complete pair (``""`` for an empty one), ``(None, False)`` when there is none."""
    query = last_tag_body(action, tag)
    return (query, True) if query is not None else (None, False)


def empty_query_observation(tag: str) -> dict:
    """The invalid observation for an empty ``<tag></tag>`` query, saying how to write one."""
    return invalid_observation(
        "empty_query",
        f"Search error: the query is empty. Write the query between the "
        f"tags: <{tag}>your query</{tag}>.",
    )


class QuerySearchTool(BaseTool):
    """A ``<tag>query</tag>`` tool answering with the top ``topk`` documents.

    Observation: ``<information>Doc 1 (Title: ...) text ...</information>``, a "no
    results" message, or an invalid observation for an empty query or a search that
    raised one of ``search_errors`` (``error_reason``, ``"{error_label}: {error}"``).
    Subclasses set ``tag`` and ``topk`` and implement :meth:`warm_up` and :meth:`search`.
    """

    tag: str = "search"
    call_tag = "search"
    call_arg = "query"
    topk: int = 3
    search_errors: tuple[type[BaseException], ...] = (Exception,)
    error_reason = "search_error"
    error_label = "Search error"
    warm_up_failure = "search backend not ready"

    async def warm_up(self) -> None:
        """Prepare the backend (load an index, open a connection)."""

    async def search(self, query: str) -> Iterable[tuple[str, str]]:
        """The top ``self.topk`` documents for ``query`` as ``(title, text)`` pairs."""
        raise NotImplementedError

    async def astart(self) -> None:
        """Prepare the backend at server start; a failure is logged here and reported to
        the model as an observation on each search (so the server still starts)."""
        try:
            await self.warm_up()
        except Exception as e:
            log.error("%s: %s: %s", self.name, self.warm_up_failure, e)

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return parse_query_action(action, self.tag)

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        query: str = parsed
        if not query:
            return empty_query_observation(self.tag), False, False
        try:
            docs = list(await self.search(query))
        except self.search_errors as e:  # a backend failure is an observation, never a crash
            log.warning("%s failed for trajectory %s: %s", self.name, trajectory_id, e)
            return invalid_observation(self.error_reason, f"{self.error_label}: {e}"), False, False
        if not docs:
            return format_no_results(query), False, True
        return format_information(docs), False, True
