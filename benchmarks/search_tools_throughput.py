"""Throughput and latency of the search tools through the real tool server.

For each row a tool server is started (``tool_server.launcher.run_server``) and
``--clients`` concurrent clients send ``--requests`` requests in total, one action per
request (as asynchronous rollout does), each with a distinct query. Printed per row:
requests/s, p50 and p99 latency (ms), and how many queries one retrieval batch served on
average where that applies. Rows:

* ``search_retrieval bm25`` / ``search_retrieval dense``: a synthetic corpus of ``--docs``
  documents indexed with ``python -m tool_server.retrieval build``;
* ``web_search local``: the offline backend over the BM25 index, cache off;
* ``web_search serper``: the HTTP backend against a local server speaking the Serper JSON
  (``--api-delay-ms`` of simulated API latency), cache off;
* ``web_search cached``: the same queries again, answered from the disk cache.

Run: ``python benchmarks/search_tools_throughput.py [--docs 500 --requests 400 --clients 32]``.
The machine's load average is printed with the figures: on a shared machine they vary.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tool_server.launcher import run_server  # noqa: E402
from tool_server.retrieval.corpus import write_corpus  # noqa: E402
from tool_server.retrieval.synthetic import make_corpus, town_name  # noqa: E402
from tool_server.websearch.fake_api import FakeSearchAPI  # noqa: E402

API_KEY = "bench-key"


def queries(n: int) -> list[str]:
    """``n`` distinct questions about the synthetic towns."""
    return [
        f"which town was founded in the year {1100 + 17 * (i % 1000)} near {town_name(i)} "
        f"question {i}"
        for i in range(n)
    ]


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile: the ``ceil(q/100 * n)``-th smallest value."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-int(q * len(s)) // 100) - 1))]


async def load(
    url: str, qs: list[str], clients: int, tag: str = "search"
) -> tuple[float, list[float], int]:
    """Send one request per query with ``clients`` in flight; returns (seconds,
    latencies, number of non-valid answers)."""
    lat: list[float] = []
    invalid = 0
    it = iter(enumerate(qs))

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal invalid
        for i, q in it:
            body = {
                "trajectory_ids": [f"t{i}"],
                "actions": [f"<{tag}>{q}</{tag}>"],
                "is_last_step": [True],
            }
            t0 = time.perf_counter()
            async with session.post(url + "/get_observation", json=body) as r:
                out = await r.json()
            lat.append(time.perf_counter() - t0)
            invalid += not out["valids"][0]

    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        return time.perf_counter() - t0, lat, invalid


def row(name: str, url: str, qs: list[str], clients: int) -> None:
    asyncio.run(load(url, qs[: min(len(qs), 2 * clients)], clients))  # warm-up
    secs, lat, invalid = asyncio.run(load(url, qs, clients))
    ms = [x * 1000 for x in lat]
    print(
        f"{name:<34} {len(qs) / secs:>9.1f} {statistics.median(ms):>9.1f} "
        f"{percentile(ms, 99):>9.1f} {invalid:>8d}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=500)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--api-delay-ms", type=float, default=50.0)
    ap.add_argument(
        "--torch-threads",
        default="default",
        help="comma list of encoder thread counts for the dense rows, e.g. 1,2",
    )
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench_search_")
    corpus = os.path.join(tmp, "corpus.jsonl")
    write_corpus(corpus, make_corpus(args.docs))
    idx = {}
    for kind in ("bm25", "dense"):
        idx[kind] = os.path.join(tmp, kind)
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tool_server.retrieval",
                "build",
                "--corpus",
                corpus,
                "--out",
                idx[kind],
                "--kind",
                kind,
            ],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(f"# built {kind} index of {args.docs} docs in {time.perf_counter() - t0:.1f} s")
    qs = queries(args.requests)
    print(
        f"# {args.requests} requests, {args.clients} concurrent clients, one action each; "
        f"cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'tool / backend':<34} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'invalid':>8}")
    common = dict(timeout=60, max_concurrency=256, workdir=tmp)
    with run_server(
        tools=["search_retrieval"], tool_opt={"retrieval_index": idx["bm25"], "topk": 3}, **common
    ) as url:
        row("search_retrieval bm25", url, qs, args.clients)
    for threads in args.torch_threads.split(","):
        opts = {"retrieval_index": idx["dense"], "topk": 3}
        if threads != "default":
            opts["retrieval_torch_threads"] = threads
        with run_server(tools=["search_retrieval"], tool_opt=opts, **common) as url:
            row(f"search_retrieval dense t={threads}", url, qs, args.clients)
    with run_server(
        tools=["web_search"],
        tool_opt={"retrieval_index": idx["bm25"], "topk": 3, "web_search_cache": "none"},
        **common,
    ) as url:
        row("web_search local (bm25)", url, qs, args.clients)
    api = FakeSearchAPI(API_KEY, delay_s=args.api_delay_ms / 1000)
    try:
        opts = {
            "web_search_backend": "serper",
            "serper_url": api.url,
            "topk": 3,
            "serper_api_key_env": "BENCH_SERPER_KEY",
            "web_search_concurrency": 64,
        }
        with run_server(
            tools=["web_search"],
            tool_opt={**opts, "web_search_cache": "none"},
            env={"BENCH_SERPER_KEY": API_KEY},
            **common,
        ) as url:
            row(f"web_search serper ({args.api_delay_ms:g}ms)", url, qs, args.clients)
        cache = os.path.join(tmp, "cache.sqlite")
        with run_server(
            tools=["web_search"],
            tool_opt={**opts, "web_search_cache": cache},
            env={"BENCH_SERPER_KEY": API_KEY},
            **common,
        ) as url:
            asyncio.run(load(url, qs, args.clients))  # fill the cache
            n = len(api.requests)
            row("web_search cached", url, qs, args.clients)
            assert len(api.requests) == n, "cached row reached the API"
    finally:
        api.close()


if __name__ == "__main__":
    main()
