"""Action parsing and the empty-query observation shared by the ``<search>`` tools
(``search_retrieval``, ``web_search``); not a tool: ``_`` files are skipped."""
from __future__ import annotations

from typing import Optional

from tool_server.observations import invalid_observation
from tool_server.tools._tags import last_tag_body


def parse_query_action(action: str, tag: str) -> tuple[Optional[str], bool]:
    """``parse_action`` of a ``<tag>query</tag>`` tool: ``(query, True)`` with the body of
    the last complete pair (``""`` for an empty one), ``(None, False)`` when there is none."""
    query = last_tag_body(action, tag)
    return (query, True) if query is not None else (None, False)


def empty_query_observation(tag: str) -> dict:
    """The invalid observation for an empty ``<tag></tag>`` query, saying how to write one."""
    return invalid_observation(
        "empty_query", f"Search error: the query is empty. Write the query between the "
        f"tags: <{tag}>your query</{tag}>.")
