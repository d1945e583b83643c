"""Web search backends behind one interface, with an on-disk cache.

``SearchBackend.search(query, k) -> list[Result]`` (async). Backends: :class:`SerperBackend`
(a Serper-style JSON HTTP API, key from an environment variable, concurrency limit,
retries with exponential backoff) and :class:`LocalBackend` (the local retrieval service,
the offline default). :class:`CachedBackend` wraps any backend with a :class:`SearchCache`.
"""

from .backend import Result, SearchBackend, SearchError
from .cache import CachedBackend, SearchCache
from .local import LocalBackend
from .retry import backoff_delay
from .serper import SerperBackend

__all__ = [
    "Result",
    "SearchBackend",
    "SearchError",
    "CachedBackend",
    "SearchCache",
    "LocalBackend",
    "SerperBackend",
    "backoff_delay",
]
