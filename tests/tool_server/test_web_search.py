"""web_search: backends (a Serper-style HTTP API served by a local aiohttp server, and
the local retrieval backend), retries with backoff, the disk cache, the key never
logged, and the tool's observations."""

import asyncio
import logging
import os
import socket
import time

import pytest
from support.retrieval import synthetic_index

from tool_server.kit.base import ToolSettings
from tool_server.retrieval.options import RetrievalOptions
from tool_server.tools.web_search import WebSearchTool
from tool_server.websearch import (
    CachedBackend,
    LocalBackend,
    Result,
    SearchCache,
    SearchError,
    SerperBackend,
    backoff_delay,
)
from tool_server.websearch.cache import cache_key
from tool_server.websearch.fake_api import FakeSearchAPI

os.environ.setdefault("HF_HUB_OFFLINE", "1")
KEY = "sk-test-SECRET-1234567890"


@pytest.fixture(scope="module")
def serper():
    s = FakeSearchAPI(api_key=KEY)
    yield s
    s.close()


@pytest.fixture
def api(serper, monkeypatch):
    serper.reset()
    monkeypatch.setenv("TEST_SERPER_KEY", KEY)
    return serper


def backend(api, **kw):
    kw.setdefault("backoff_s", 0.01)
    return SerperBackend(url=api.url, api_key_env="TEST_SERPER_KEY", **kw)


def test_backoff_delay_doubles_and_caps():
    assert [backoff_delay(a, 0.5) for a in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_delay(10, 0.5, cap_s=8.0) == 8.0
    assert backoff_delay(0, 0.5, retry_after_s=3.0) == 3.0
    with pytest.raises(ValueError):
        backoff_delay(-1, 0.5)


def test_http_backend_speaks_the_api(api):
    results = asyncio.run(backend(api).search("tallest mountain", 3))
    assert results == [
        Result(
            f"tallest mountain result {i}",
            f"https://example.org/{i}",
            f"About tallest mountain: fact number {i}.",
        )
        for i in (1, 2, 3)
    ]
    assert api.requests == [{"body": {"q": "tallest mountain", "num": 3}, "key": KEY}]


def test_http_backend_retries_500_then_succeeds(api, caplog):
    api.fail_with = [500, 503]
    b = backend(api, retries=3)
    caplog.set_level(logging.DEBUG)
    t0 = time.perf_counter()
    results = asyncio.run(b.search("q1", 2))
    assert len(results) == 2 and len(api.requests) == 3 and b.requests_made == 3
    assert time.perf_counter() - t0 >= 0.01 + 0.02  # backoff 0.01 then 0.02 s
    assert "retry 1/3" in caplog.text and "HTTP 500" in caplog.text
    assert KEY not in caplog.text


def test_http_backend_429_honours_retry_after(api):
    api.fail_with = [429]
    api.retry_after = "0.3"
    t0 = time.perf_counter()
    asyncio.run(backend(api, retries=1).search("q", 1))
    assert time.perf_counter() - t0 >= 0.3


def test_http_backend_gives_up_after_retries(api, caplog):
    api.fail_with = [502, 502, 502]
    with pytest.raises(SearchError, match=r"failed after 3 attempt\(s\): HTTP 502") as e:
        asyncio.run(backend(api, retries=2).search("q", 1))
    assert len(api.requests) == 3 and KEY not in str(e.value)


def test_http_backend_does_not_retry_auth_errors(api, monkeypatch):
    monkeypatch.setenv("TEST_SERPER_KEY", "wrong-key")
    with pytest.raises(SearchError, match=r"HTTP 403 \(check the API key\)") as e:
        asyncio.run(backend(api, retries=3).search("q", 1))
    assert len(api.requests) == 1 and "wrong-key" not in str(e.value)


def test_http_backend_missing_key_and_unreachable(api, monkeypatch):
    monkeypatch.delenv("TEST_SERPER_KEY")
    with pytest.raises(SearchError, match="environment variable TEST_SERPER_KEY"):
        asyncio.run(backend(api).search("q", 1))
    assert api.requests == []
    monkeypatch.setenv("TEST_SERPER_KEY", KEY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/search"
    b = SerperBackend(url=dead, api_key_env="TEST_SERPER_KEY", retries=1, backoff_s=0.01)
    with pytest.raises(SearchError, match="ClientConnectorError"):
        asyncio.run(b.search("q", 1))
    assert KEY not in repr(b)


def test_http_backend_concurrency_limit(api):
    api.delay_s = 0.05
    b = backend(api, concurrency=2)

    async def go():
        return await asyncio.gather(*(b.search(f"q{i}", 1) for i in range(6)))

    out = asyncio.run(go())
    assert len(out) == 6 and api.max_in_flight == 2


def test_cache_hit_makes_no_request(api, tmp_path):
    cache = SearchCache(str(tmp_path / "c.sqlite"))
    b = CachedBackend(backend(api), cache)
    first = asyncio.run(b.search("deep  sea fish", 2))
    assert len(api.requests) == 1
    again = asyncio.run(b.search(" deep sea   fish ", 2))  # same query, other spacing
    assert again == first and len(api.requests) == 1 and cache.hits == 1
    asyncio.run(b.search("deep sea fish", 3))  # another k is another entry
    assert len(api.requests) == 2
    # The cache is on disk: a new process (here: a new cache object) still hits.
    b2 = CachedBackend(backend(api), SearchCache(str(tmp_path / "c.sqlite")))
    assert asyncio.run(b2.search("deep sea fish", 2)) == first and len(api.requests) == 2
    # Keys separate backends.
    assert cache_key("serper:a", "q", 1) != cache_key("local:a", "q", 1)


def test_cache_failures_are_not_stored_and_entries_expire(api, tmp_path):
    cache = SearchCache(str(tmp_path / "c.sqlite"), ttl_s=0.3)
    b = CachedBackend(backend(api, retries=0), cache)
    api.fail_with = [500]
    with pytest.raises(SearchError):
        asyncio.run(b.search("q", 1))
    assert len(cache) == 0
    asyncio.run(b.search("q", 1))
    asyncio.run(b.search("q", 1))
    assert len(api.requests) == 2 and len(cache) == 1
    time.sleep(0.35)
    assert cache.get(b.cache_id, "q", 1) is None  # expired: never served
    assert cache.purge_expired() == 1 and len(cache) == 0


def test_local_backend_searches_the_index():
    b = LocalBackend(RetrievalOptions(index_dir=synthetic_index("bm25")))
    res = asyncio.run(b.search("magnetic needle north", 1))
    assert res[0].title == "Compass" and res[0].link.startswith("local://doc-")
    with pytest.raises(SearchError, match="no retrieval index is configured"):
        asyncio.run(LocalBackend(RetrievalOptions(index_dir=None)).search("q", 1))


def test_tool_with_local_backend_is_the_default(tmp_path):
    t = WebSearchTool(
        ToolSettings(
            workdir=str(tmp_path), extra={"retrieval_index": synthetic_index("bm25"), "topk": 2}
        )
    )
    assert isinstance(t.backend, CachedBackend) and isinstance(t.backend.backend, LocalBackend)
    parsed, ok = t.parse_action("<search>old</search> now <search>chess board game</search>")
    assert ok and parsed == "chess board game"
    obs, done, valid = asyncio.run(t.conduct_action("t", parsed, {}))
    assert obs.startswith("<information>Doc 1 (Title: Chess) Chess is a board game")
    assert (done, valid) == (False, True)
    assert os.path.exists(tmp_path / "web_search_cache.sqlite")
    t.close()


def test_tool_with_http_backend_and_custom_tag(api, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    t = WebSearchTool(
        ToolSettings(
            workdir=str(tmp_path),
            extra={
                "web_search_backend": "serper",
                "serper_url": api.url,
                "serper_api_key_env": "TEST_SERPER_KEY",
                "web_search_tag": "web",
                "web_search_backoff_s": "0.01",
                "topk": 2,
            },
        )
    )
    assert t.parse_action("<search>x</search>") == (None, False)
    parsed, ok = t.parse_action("<web>moon landing</web>")
    api.fail_with = [500]
    obs, done, valid = asyncio.run(t.conduct_action("t", parsed, {}))
    assert obs == (
        "<information>Doc 1 (Title: moon landing result 1) About moon landing: "
        "fact number 1.\nDoc 2 (Title: moon landing result 2) About moon "
        "landing: fact number 2.</information>"
    )
    assert valid and len(api.requests) == 2
    obs2, _, _ = asyncio.run(t.conduct_action("t2", parsed, {}))
    assert obs2 == obs and len(api.requests) == 2  # served from the cache
    obs, _, valid = asyncio.run(t.conduct_action("t", "", {}))
    assert obs["invalid_reason"] == "empty_query" and not valid
    assert "query is empty" in obs["obs"] and "<web>your query</web>" in obs["obs"]
    api.fail_with = [500] * 4
    obs, _, valid = asyncio.run(t.conduct_action("t", "never works", {}))
    assert obs == {
        "obs": "Search error: search API failed after 4 attempt(s): HTTP 500",
        "invalid_reason": "search_error",
    }
    assert not valid
    assert KEY not in caplog.text
    t.close()


def test_tool_bad_options_are_clear(tmp_path):
    with pytest.raises(ValueError, match="'web_search_backend' must be one of"):
        WebSearchTool(ToolSettings(workdir=str(tmp_path), extra={"web_search_backend": "bing"}))
    with pytest.raises(ValueError, match="tag name '<x>' is not valid"):
        WebSearchTool(ToolSettings(workdir=str(tmp_path), extra={"web_search_tag": "<x>"}))


def test_end_to_end_http_backend_through_the_server(api, tmp_path):
    from tool_server.launcher import post_json, run_server

    cache = tmp_path / "cache.sqlite"
    opts = {
        "web_search_backend": "serper",
        "serper_url": api.url,
        "serper_api_key_env": "TEST_SERPER_KEY",
        "web_search_cache": str(cache),
        "web_search_backoff_s": 0.01,
        "topk": 1,
    }
    with run_server(
        tools=["web_search"], tool_opt=opts, workdir=str(tmp_path), env={"TEST_SERPER_KEY": KEY}
    ) as url:
        api.fail_with = [503]
        status, body = post_json(
            url + "/get_observation",
            {
                "trajectory_ids": ["a", "b"],
                "actions": ["<search>capital of peru</search>", "<search>deepest lake</search>"],
            },
        )
        assert status == 200, body
        assert body["observations"] == [
            "<information>Doc 1 (Title: capital of peru result 1) About capital of peru: "
            "fact number 1.</information>",
            "<information>Doc 1 (Title: deepest lake result 1) About deepest lake: "
            "fact number 1.</information>",
        ]
        assert body["valids"] == [True, True]
        assert len(api.requests) == 3  # one of them was retried after the 503
        n = len(api.requests)
        status, body = post_json(
            url + "/get_observation",
            {"trajectory_ids": ["c"], "actions": ["<search>capital  of peru</search>"]},
        )
        assert body["observations"][0].startswith("<information>Doc 1 (Title: capital of peru")
        assert len(api.requests) == n  # the disk cache answered
        api.fail_with = [500] * 4  # every attempt fails: an error observation, not a crash
        status, body = post_json(
            url + "/get_observation",
            {"trajectory_ids": ["d"], "actions": ["<search>unlucky</search>"]},
        )
        assert status == 200 and body["valids"] == [False]
        assert body["observations"][0] == {
            "obs": "Search error: search API failed after 4 attempt(s): HTTP 500",
            "invalid_reason": "search_error",
        }
    assert cache.exists()


def test_end_to_end_local_backend_is_the_offline_default(tmp_path):
    from tool_server.launcher import post_json, run_server

    with run_server(
        tools=["web_search"],
        workdir=str(tmp_path),
        tool_opt={"retrieval_index": synthetic_index("bm25"), "topk": 1},
    ) as url:
        status, body = post_json(
            url + "/get_observation",
            {
                "trajectory_ids": ["a", "b"],
                "actions": ["<search>chess board game</search>", "no search here"],
            },
        )
        assert status == 200
        assert body["observations"][0] == (
            "<information>Doc 1 (Title: Chess) Chess is a board game for two players on an "
            "eight by eight grid; each side commands sixteen pieces and tries to checkmate "
            "the opposing king.</information>"
        )
        assert body["valids"] == [True, False]
    assert (tmp_path / "web_search_cache.sqlite").exists()
