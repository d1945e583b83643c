"""A Serper-style HTTP search backend.

Request: ``POST url`` with JSON ``{"q": query, "num": k}`` and header ``X-API-KEY``
(read from an environment variable at each call; the key is never logged or put in an
error). Response: ``{"organic": [{"title", "link", "snippet"}, ...]}``. At most
``concurrency`` requests are in flight; 429/5xx answers and connection errors are
retried ``retries`` times with exponential backoff (:func:`.retry.backoff_delay`).
"""

from __future__ import annotations

import asyncio
import logging
import os

import aiohttp

from .backend import Result, SearchBackend, SearchError
from .retry import backoff_delay, is_retryable_status, parse_retry_after

log = logging.getLogger(__name__)

DEFAULT_URL = "https://google.serper.dev/search"
DEFAULT_KEY_ENV = "SERPER_API_KEY"


class SerperBackend(SearchBackend):
    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key_env: str = DEFAULT_KEY_ENV,
        concurrency: int = 8,
        retries: int = 3,
        backoff_s: float = 0.5,
        backoff_cap_s: float = 8.0,
        timeout_s: float = 10.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"web_search_concurrency must be >= 1, got {concurrency}")
        if retries < 0:
            raise ValueError(f"web_search_retries must be >= 0, got {retries}")
        self.url = url
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_cap_s = backoff_cap_s
        self.timeout_s = timeout_s
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        self.requests_made = 0  # HTTP requests sent (for metrics and tests)

    def __repr__(self) -> str:  # no key here, ever
        return f"SerperBackend(url={self.url!r}, api_key_env={self.api_key_env!r})"

    @property
    def cache_id(self) -> str:
        return f"serper:{self.url}"

    def _semaphore(self) -> asyncio.Semaphore:
        # One semaphore per event loop (an asyncio.Semaphore belongs to one loop).
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(id(loop))
        if sem is None:
            sem = self._semaphores[id(loop)] = asyncio.Semaphore(self.concurrency)
        return sem

    def _api_key(self) -> str:
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise SearchError(
                f"web search is not configured: the environment variable "
                f"{self.api_key_env} (the search API key) is not set"
            )
        return key

    async def search(self, query: str, k: int) -> list[Result]:
        headers = {"X-API-KEY": self._api_key(), "Content-Type": "application/json"}
        payload = {"q": query, "num": k}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        last_problem = "no attempt made"
        async with self._semaphore():
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for attempt in range(self.retries + 1):
                    retry_after = None
                    try:
                        self.requests_made += 1
                        async with session.post(self.url, json=payload, headers=headers) as r:
                            if r.status == 200:
                                return _parse_results(await r.json(content_type=None), k)
                            last_problem = f"HTTP {r.status}"
                            if not is_retryable_status(r.status):
                                raise SearchError(
                                    f"search API answered {last_problem}"
                                    + (" (check the API key)" if r.status in (401, 403) else "")
                                )
                            retry_after = parse_retry_after(r.headers.get("Retry-After"))
                    except (TimeoutError, aiohttp.ClientError) as e:
                        last_problem = f"{type(e).__name__}"
                    if attempt < self.retries:
                        delay = backoff_delay(
                            attempt, self.backoff_s, self.backoff_cap_s, retry_after
                        )
                        log.info(
                            "search API %s, retry %d/%d in %.2fs",
                            last_problem,
                            attempt + 1,
                            self.retries,
                            delay,
                        )
                        await asyncio.sleep(delay)
        raise SearchError(f"search API failed after {self.retries + 1} attempt(s): {last_problem}")


def _parse_results(body: object, k: int) -> list[Result]:
    """The ``organic`` results of a response body; a body without them is an error."""
    if not isinstance(body, dict) or not isinstance(body.get("organic", []), list):
        raise SearchError("search API response has no 'organic' list of results")
    out = []
    for item in body.get("organic", [])[:k]:
        if not isinstance(item, dict):
            continue
        out.append(
            Result(
                title=str(item.get("title", "")),
                link=str(item.get("link", "")),
                snippet=str(item.get("snippet", "")),
            )
        )
    return out
