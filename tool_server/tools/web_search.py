"""``web_search``: search the web (the deep-search task family).

Action: ``... <search>query</search>`` (the tag is configurable; the last complete pair in
the turn). Observation: ``<information>Doc 1 (Title: ...) snippet\\n...</information>``.

Options (``--tool-opt key=value``; environment fallback in brackets):
``web_search_backend`` [VERLTOOL_WEB_SEARCH_BACKEND]: ``local`` (default, offline: the
retrieval service over ``retrieval_index``) or ``serper`` (HTTP JSON API);
``web_search_tag`` (``search``); ``topk`` (3);
``web_search_cache`` [VERLTOOL_WEB_SEARCH_CACHE]: sqlite file
(default ``<workdir>/web_search_cache.sqlite``; ``none`` disables caching);
``web_search_cache_ttl_s`` (604800);
``serper_url``, ``serper_api_key_env`` (``SERPER_API_KEY``: the *name* of the variable
holding the key), ``web_search_concurrency`` (8), ``web_search_retries`` (3),
``web_search_backoff_s`` (0.5).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

from tool_server.observations import invalid_observation
from tool_server.retrieval.format import format_information, format_no_results
from tool_server.retrieval.options import RetrievalOptions
from tool_server.tools._options import tool_option
from tool_server.tools._search import empty_query_observation, parse_query_action
from tool_server.tools._tags import tag_regex
from tool_server.tools.base import BaseTool, Observation, ToolSettings
from tool_server.websearch import (CachedBackend, LocalBackend, SearchBackend, SearchCache,
                                   SearchError, SerperBackend)
from tool_server.websearch.serper import DEFAULT_KEY_ENV, DEFAULT_URL

log = logging.getLogger(__name__)

BACKENDS = ("local", "serper")


def make_backend(settings: ToolSettings) -> SearchBackend:
    """The backend the options select, wrapped in the disk cache unless disabled."""
    extra = settings.extra
    kind = tool_option(extra, "web_search_backend", str, "local",
                       env="VERLTOOL_WEB_SEARCH_BACKEND")
    if kind not in BACKENDS:
        raise ValueError(f"tool option 'web_search_backend' must be one of {BACKENDS}, "
                         f"got {kind!r}")
    backend: SearchBackend
    if kind == "local":
        backend = LocalBackend(RetrievalOptions.from_extra(extra))
    else:
        backend = SerperBackend(
            url=tool_option(extra, "serper_url", str, DEFAULT_URL),
            api_key_env=tool_option(extra, "serper_api_key_env", str, DEFAULT_KEY_ENV),
            concurrency=tool_option(extra, "web_search_concurrency", int, 8, minimum=1),
            retries=tool_option(extra, "web_search_retries", int, 3, minimum=0),
            backoff_s=tool_option(extra, "web_search_backoff_s", float, 0.5, minimum=0),
            timeout_s=settings.timeout_s)
    cache_path = tool_option(extra, "web_search_cache", str,
                             os.path.join(settings.workdir, "web_search_cache.sqlite"),
                             env="VERLTOOL_WEB_SEARCH_CACHE")
    if cache_path.lower() == "none":
        return backend
    ttl = tool_option(extra, "web_search_cache_ttl_s", float, 7 * 86400.0)
    return CachedBackend(backend, SearchCache(cache_path, ttl_s=ttl))


class WebSearchTool(BaseTool):
    name = "web_search"
    usage = ("Search the web: <search>your query</search>. Returns the top results inside "
             "<information>...</information>.")

    def __init__(self, settings: Optional[ToolSettings] = None) -> None:
        super().__init__(settings)
        extra = self.settings.extra
        self.tag: str = tool_option(extra, "web_search_tag", str, "search")
        tag_regex(self.tag)  # validate now: a bad tag is a configuration error
        self.topk: int = tool_option(extra, "topk", int, 3, minimum=1)
        self.backend = make_backend(self.settings)

    async def astart(self) -> None:
        """Prepare the backend at server start (the local backend loads its index); a
        failure is logged and reported as an observation on each search."""
        try:
            await self.backend.warm_up()
        except Exception as e:
            log.error("web_search: backend not ready: %s", e)

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return parse_query_action(action, self.tag)

    async def conduct_action(self, trajectory_id: str, parsed: Any, extra_field: dict
                             ) -> tuple[Observation, bool, bool]:
        query: str = parsed
        if not query:
            return empty_query_observation(self.tag), False, False
        try:
            results = await self.backend.search(query, self.topk)
        except SearchError as e:
            log.warning("web_search failed for trajectory %s: %s", trajectory_id, e)
            return invalid_observation("search_error", f"Search error: {e}"), False, False
        if not results:
            return format_no_results(query), False, True
        return format_information((r.title, r.snippet) for r in results), False, True

    def close(self) -> None:
        super().close()
        if isinstance(self.backend, CachedBackend):
            self.backend.cache.close()
