"""``search_retrieval``: search a local corpus index (the retrieval-QA task family).

Action: ``... <search>query</search>`` (the last complete pair in the turn). Observation:
the top-k documents, ``<information>Doc 1 (Title: ...) text\\nDoc 2 ...</information>``.
Options (``--tool-opt``): ``retrieval_index`` (required), ``topk`` (3), and the service
options of :mod:`tool_server.retrieval.options`. Concurrent searches are batched.
An empty query or a failing index gives an observation saying what is wrong.
Under ``--compat verltool`` (or ``--tool-opt search_retrieval_compat=verltool``) parsing
and observation follow VerlTool's search tool (``tool_server/kit/search_compat.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from tool_server.kit import search_compat as vt
from tool_server.kit.base import Observation, ToolSettings
from tool_server.kit.options import tool_option
from tool_server.kit.search import QuerySearchTool
from tool_server.retrieval.options import RetrievalOptions

log = logging.getLogger(__name__)


class SearchRetrievalTool(QuerySearchTool):
    name = "search_retrieval"
    usage = (
        "Search the knowledge corpus: <search>your query</search>. Returns the top "
        "documents inside <information>...</information>."
    )
    tag = "search"
    error_reason = "retrieval_error"
    error_label = "Retrieval error"
    warm_up_failure = "cannot open the retrieval index"
    verltool_usage = (
        "You can search for information by putting your query between <search> and </search> tags."
    )

    def __init__(self, settings: ToolSettings | None = None) -> None:
        super().__init__(settings)
        extra = self.settings.extra
        self.topk: int = tool_option(
            extra, "topk", int, 3, env="VERLTOOL_RETRIEVAL_TOPK", minimum=1
        )
        self.retrieval = RetrievalOptions.from_extra(extra)

    async def warm_up(self) -> None:
        await self.retrieval.warm_up()

    async def search(self, query: str) -> list[tuple[str, str]]:
        hits = await self.retrieval.service().search(query, self.topk)
        return [(h.title, h.contents) for h in hits]

    def parse_action(self, action: str) -> tuple[Any, bool]:
        if self.verltool_compat:
            parsed = vt.parse(action)
            return (parsed, True) if parsed is not None else (None, False)
        return super().parse_action(action)

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        if not isinstance(parsed, vt.CompatAction):
            return await super().conduct_action(trajectory_id, parsed, extra_field)
        if parsed.kind == "answer":
            return "", True, False
        try:
            docs = list(await self.search(parsed.text))
        except Exception as e:  # VerlTool's retriever client answers no documents
            log.warning("%s failed for trajectory %s: %s", self.name, trajectory_id, e)
            docs = []
        return vt.format_information(docs), False, True
