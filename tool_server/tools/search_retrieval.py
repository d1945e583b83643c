"""``search_retrieval``: search a local corpus index (the retrieval-QA task family).

Action: ``... <search>query</search>`` (the last complete pair in the turn). Observation:
the top-k documents, ``<information>Doc 1 (Title: ...) text\\nDoc 2 ...</information>``.
Options (``--tool-opt``): ``retrieval_index`` (required), ``topk`` (3), and the service
options of :mod:`tool_server.retrieval.options`. Concurrent searches are batched.
An empty query or a failing index gives an observation saying what is wrong.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from tool_server.observations import invalid_observation
from tool_server.retrieval.format import format_information, format_no_results
from tool_server.retrieval.options import RetrievalOptions
from tool_server.tools._options import tool_option
from tool_server.tools._search import empty_query_observation, parse_query_action
from tool_server.tools.base import BaseTool, Observation, ToolSettings

log = logging.getLogger(__name__)


class SearchRetrievalTool(BaseTool):
    name = "search_retrieval"
    usage = ("Search the knowledge corpus: <search>your query</search>. Returns the top "
             "documents inside <information>...</information>.")
    tag = "search"

    def __init__(self, settings: Optional[ToolSettings] = None) -> None:
        super().__init__(settings)
        extra = self.settings.extra
        self.topk: int = tool_option(extra, "topk", int, 3, env="VERLTOOL_RETRIEVAL_TOPK",
                                     minimum=1)
        self.retrieval = RetrievalOptions.from_extra(extra)

    async def astart(self) -> None:
        """Load the index at server start; a failure is logged here and reported to the
        model as an observation on each search (so the server still starts)."""
        try:
            await self.retrieval.warm_up()
        except Exception as e:
            log.error("search_retrieval: cannot open the retrieval index: %s", e)

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return parse_query_action(action, self.tag)

    async def conduct_action(self, trajectory_id: str, parsed: Any, extra_field: dict
                             ) -> tuple[Observation, bool, bool]:
        query: str = parsed
        if not query:
            return empty_query_observation(self.tag), False, False
        try:
            hits = await self.retrieval.service().search(query, self.topk)
        except Exception as e:  # an index failure is an observation, never a crash
            log.warning("search_retrieval failed for trajectory %s: %s", trajectory_id, e)
            return invalid_observation("retrieval_error", f"Retrieval error: {e}"), False, False
        if not hits:
            return format_no_results(query), False, True
        return format_information((h.title, h.contents) for h in hits), False, True
