"""An on-disk cache of search results (sqlite), so a repeated query costs nothing.

Key: ``sha256(json([backend.cache_id, normalised query, k]))``, the query normalised by
collapsing whitespace. Entries older than ``ttl_s`` are never returned and are deleted
by :meth:`SearchCache.purge_expired` (run when the cache opens and every
``purge_every`` writes). Only successful searches are stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time

from .backend import Result, SearchBackend


def normalise_query(query: str) -> str:
    return " ".join(query.split())


def cache_key(backend_id: str, query: str, k: int) -> str:
    """``sha256`` hex of the backend identity, the normalised query and ``k``."""
    raw = json.dumps([backend_id, normalise_query(query), int(k)], ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class SearchCache:
    def __init__(self, path: str, ttl_s: float = 7 * 86400.0, purge_every: int = 256) -> None:
        if ttl_s <= 0:
            raise ValueError(f"web_search_cache_ttl_s must be > 0, got {ttl_s}")
        self.path = path
        self.ttl_s = ttl_s
        self._purge_every = purge_every
        self._writes = 0
        self._lock = threading.Lock()
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._db = sqlite3.connect(
            path, check_same_thread=False, timeout=30.0, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, "
            "backend TEXT NOT NULL, query TEXT NOT NULL, k INTEGER NOT NULL, "
            "value TEXT NOT NULL, created REAL NOT NULL)"
        )
        self.hits = 0
        self.misses = 0
        self.purge_expired()

    def get(self, backend_id: str, query: str, k: int) -> list[Result] | None:
        key = cache_key(backend_id, query, k)
        with self._lock:
            row = self._db.execute(
                "SELECT value, created FROM results WHERE key = ?", (key,)
            ).fetchone()
        if row is None or time.time() - row[1] > self.ttl_s:
            self.misses += 1
            return None
        self.hits += 1
        return [Result(**r) for r in json.loads(row[0])]

    def put(self, backend_id: str, query: str, k: int, results: list[Result]) -> None:
        value = json.dumps([r.to_json() for r in results], ensure_ascii=False)
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?)",
                (
                    cache_key(backend_id, query, k),
                    backend_id,
                    normalise_query(query),
                    int(k),
                    value,
                    time.time(),
                ),
            )
            self._writes += 1
            purge = self._writes % self._purge_every == 0
        if purge:
            self.purge_expired()

    def purge_expired(self) -> int:
        """Delete entries older than the TTL; returns how many were deleted."""
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM results WHERE created < ?", (time.time() - self.ttl_s,)
            )
            return cur.rowcount

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CachedBackend(SearchBackend):
    """``backend`` with results served from ``cache`` when present."""

    def __init__(self, backend: SearchBackend, cache: SearchCache) -> None:
        self.backend = backend
        self.cache = cache

    @property
    def cache_id(self) -> str:
        return self.backend.cache_id

    async def warm_up(self) -> None:
        await self.backend.warm_up()

    async def search(self, query: str, k: int) -> list[Result]:
        cached = self.cache.get(self.backend.cache_id, query, k)
        if cached is not None:
            return cached
        results = await self.backend.search(query, k)
        self.cache.put(self.backend.cache_id, query, k, results)
        return results
