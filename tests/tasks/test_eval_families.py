"""``python -m verltool_jax.eval --config configs/<family>.py:tiny --checkpoint base`` on
every family's tiny config: each evaluates its own held-out prompts (one per test file)
through the tool server and the JAX sampler and prints its per-set table. The visual
family's rows carry images, so the eval's prompts need the policy's image processor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verltool_jax import eval as eval_cli

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / ".." / "shared" / "data"
SPIDER = DATA / "spider"
QUIX = DATA / "swe" / "quixbugs"


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _sandbox_ok() -> bool:
    from tool_server.sandbox import sandbox_status

    return sandbox_status()[0]


def _search_data(tmp: Path) -> list[str]:
    """A six-passage corpus, its BM25 index and four NQ-layout questions."""
    from tool_server.retrieval.index import build_index

    corpus = tmp / "corpus.json"
    passages = [
        ("Apollo 17", "Apollo 17 was the last time people walked on the moon, in December 1972."),
        ("Bobby Scott", "Bobby Scott and Bob Russell wrote He Ain't Heavy, He's My Brother."),
        ("Paris", "Paris is the capital and largest city of France."),
        ("Nile", "The Nile is a major north-flowing river in northeastern Africa."),
        ("Everest", "Mount Everest is Earth's highest mountain above sea level."),
        ("Python", "Python is a programming language created by Guido van Rossum."),
    ]
    corpus.write_text(json.dumps([{"title": t, "text": x} for t, x in passages]))
    build_index([str(corpus)], str(tmp / "index"), "bm25")
    questions = tmp / "nq_open_dev.jsonl"
    qs = [
        ("when did people last walk on the moon", ["December 1972"]),
        ("what is the capital of france", ["Paris"]),
        ("what is the highest mountain", ["Mount Everest"]),
        ("who created python", ["Guido van Rossum"]),
    ]
    questions.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in qs))
    return [
        f"--config.task.train_files=('{questions}',)",
        f"--config.task.corpus_files=('{corpus}',)",
        f"--config.tool_server.tool_opt.retrieval_index={tmp / 'index'}",
        "--config.task.num_eval=2",
    ]


def _needs(ok: bool, why: str):
    return pytest.mark.skipif(not ok, reason=why)


# Each runs in 10-35 s here. SQL and SWE are marked slow only because their families'
# own tests run this same entry point in the default suite (test_vt_sql_family.py,
# test_swe_eval.py).
slow = pytest.mark.slow
FAMILIES = [
    pytest.param("tiny_math.py:smoke", [], id="tiny_math"),
    pytest.param(
        "vt_math.py:tiny",
        [f"--config.task.data_dir={DATA}"],
        id="vt_math",
        marks=_needs((DATA / "gsm8k" / "test.jsonl").is_file(), "no ../shared/data"),
    ),
    pytest.param("vt_search.py:tiny", "search", id="vt_search"),
    pytest.param("vt_deepsearch.py:tiny", "search", id="vt_deepsearch"),
    pytest.param(
        "vt_sql.py:tiny",
        [f"--config.task.spider_dir={SPIDER}"],
        id="vt_sql",
        marks=[slow, _needs((SPIDER / "test_queries.csv").is_file(), "no Spider data")],
    ),
    pytest.param(
        "vt_swe.py:tiny",
        [
            f"--config.task.quixbugs_dir={QUIX}",
            "--config.task.programs=('gcd',)",
            "--config.task.mutants_per_program=0",
        ],
        id="vt_swe",
        marks=[
            slow,
            _needs((QUIX / "python_testcases").is_dir(), "no QuixBugs data"),
            _needs(_sandbox_ok(), "no sandbox"),
        ],
    ),
    pytest.param("vt_visual.py:tiny", [], id="vt_visual"),
    pytest.param(
        "vt_reasoning.py:tiny",
        [],
        id="vt_reasoning",
        marks=_needs(_has_module("reasoning_gym"), "reasoning-gym is not installed"),
    ),
]


@pytest.mark.parametrize("config,extra", FAMILIES)
def test_eval_entry_point_on_every_family(tmp_path, capfd, config, extra):
    if extra == "search":
        extra = _search_data(tmp_path)
    out_json = tmp_path / "eval.json"
    rc = eval_cli.main(
        [
            "--config",
            f"{REPO}/configs/{config}",
            "--checkpoint",
            "base",
            "--limit",
            "1",
            f"--config.trainer.out_dir={tmp_path / 'run'}",
            "--config.sampler.backend=jax",
            "--config.rollout.max_response_tokens=16",
            "--config.rollout.max_turns=1",
            "--json",
            str(out_json),
            *extra,
        ]
    )
    console = capfd.readouterr()
    assert rc == 0, console.err + console.out
    sets = json.loads(out_json.read_text())["modes"]["greedy"]
    assert sets and all(m["problems"] == 1 for m in sets.values())  # --limit 1 per file
    assert any(x.startswith("greedy     ") for x in console.out.splitlines())
    assert (tmp_path / "run" / "eval.log").is_file()
