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

import os

from tool_server.kit.base import ToolSettings
from tool_server.kit.options import tool_option
from tool_server.kit.search import QuerySearchTool
from tool_server.kit.tags import tag_regex
from tool_server.retrieval.options import RetrievalOptions
from tool_server.websearch import (
    CachedBackend,
    LocalBackend,
    SearchBackend,
    SearchCache,
    SearchError,
    SerperBackend,
)
from tool_server.websearch.serper import DEFAULT_KEY_ENV, DEFAULT_URL

BACKENDS = ("local", "serper")


def make_backend(settings: ToolSettings) -> SearchBackend:
    """The backend the options select, wrapped in the disk cache unless disabled."""
    extra = settings.extra
    kind = tool_option(extra, "web_search_backend", str, "local", env="VERLTOOL_WEB_SEARCH_BACKEND")
    if kind not in BACKENDS:
        raise ValueError(
            f"tool option 'web_search_backend' must be one of {BACKENDS}, got {kind!r}"
        )
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
            timeout_s=settings.timeout_s,
        )
    cache_path = tool_option(
        extra,
        "web_search_cache",
        str,
        os.path.join(settings.workdir, "web_search_cache.sqlite"),
        env="VERLTOOL_WEB_SEARCH_CACHE",
    )
    if cache_path.lower() == "none":
        return backend
    ttl = tool_option(extra, "web_search_cache_ttl_s", float, 7 * 86400.0)
    return CachedBackend(backend, SearchCache(cache_path, ttl_s=ttl))


class WebSearchTool(QuerySearchTool):
    name = "web_search"
    usage = (
        "Search the web: <search>your query</search>. Returns the top results inside "
        "<information>...</information>."
    )
    search_errors = (SearchError,)
    warm_up_failure = "backend not ready"

    def __init__(self, settings: ToolSettings | None = None) -> None:
        super().__init__(settings)
        extra = self.settings.extra
        self.tag: str = tool_option(extra, "web_search_tag", str, "search")
        tag_regex(self.tag)  # validate now: a bad tag is a configuration error
        self.topk: int = tool_option(extra, "topk", int, 3, minimum=1)
        self.backend = make_backend(self.settings)

    async def warm_up(self) -> None:
        await self.backend.warm_up()

    async def search(self, query: str) -> list[tuple[str, str]]:
        return [(r.title, r.snippet) for r in await self.backend.search(query, self.topk)]

    def close(self) -> None:
        super().close()
        if isinstance(self.backend, CachedBackend):
            self.backend.cache.close()
