"""Retrieval question answering (the search and deep-search families): question files in
their upstream layouts -> verl-layout parquet with an agent prompt.

Inputs (``config.task``): ``train_files`` / ``eval_files``, question files read by
:func:`tool_server.retrieval.questions.read_questions` (NQ-open JSONL with ``question``
and an ``answer`` list, HotpotQA with ``question`` and ``answer``, IRCoT JSONL); a
Search-R1 parquet file is taken as is (its rows keep their own prompt, ``data_source``
and ``reward_model.ground_truth.target``). ``answerable_ids``: the JSON written by
``python -m tool_server.retrieval build --answerable-out`` keeps only the questions whose
answer the corpus holds. Without ``eval_files`` the held-out split is ``num_eval``
questions drawn (by ``seed``) from the training questions and removed from them.

Each generated row::

    {"prompt": [{"role": "user", "content": PROMPT + question}],
     "data_source": "nq" | "hotpotqa" | ...,            # selects qa_em unless reward.name
     "ability": "qa",
     "reward_model": {"style": "rule", "ground_truth": {"target": [answers]}},
     "extra_info": {"split", "index", "id", "question", "gold_titles", ...}}

Before any data is written, :func:`check_retrieval` makes sure the index the tool server
will search exists and was built from ``task.corpus_files`` (same fingerprint).

SFT demonstrations (``task.num_demos`` > 0; Search-R1 itself trains from the instruct
model without them, a 135M model needs them to learn the format at all): for training
questions whose gold answer appears in what the search tool returns for the question
itself, the response ``<search> QUESTION </search>`` | the tool's real observation |
``<answer> ANSWER </answer>``, written to ``sft.parquet``
(:mod:`verltool_jax.tasks.demonstrations`).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tool_server.retrieval.answers import contains_normalized, normalize_answer
from tool_server.retrieval.index import RetrievalIndexError, build_command, check_index, read_meta
from tool_server.retrieval.questions import Question, QuestionError, read_questions
from verltool_jax.data.readers import write_rows
from verltool_jax.rewards.qa_reward import F1_THRESHOLD_KEY
from verltool_jax.tasks import EvalReport, TaskFiles

# The Search-R1 instruction, in our own words, with its tags.
SEARCH_R1_PROMPT = (
    "Answer the question below. Reason inside <think> and </think> each time you receive "
    "new information. If a fact is missing, ask the search engine by writing <search> your "
    "query </search>; the best matching passages come back between <information> and "
    "</information>. You may search more than once. When you know enough, write only the "
    "final answer between <answer> and </answer>, with no explanation, for example "
    "<answer> Paris </answer>. Question: "
)
# The deep-search instruction: web search plus a Python interpreter.
DEEP_SEARCH_PROMPT = (
    "Research the question below step by step, reasoning inside <think> and </think>. "
    "Search the web by writing <search> your query </search>; results come back between "
    "<information> and </information>. Run Python by writing <python> code </python>; "
    "what it prints comes back to you. Combine facts from several searches if the question "
    "needs several hops. When you are sure, write only the final answer between <answer> "
    "and </answer>, for example <answer> 1912 </answer>. Question: "
)
PROMPTS = {"search_r1": SEARCH_R1_PROMPT, "deep_search": DEEP_SEARCH_PROMPT}
# Tools that search the local index (web_search only with its default local backend).
INDEX_TOOLS = ("search_retrieval", "web_search")


def make_row(q: Question, prompt: str, split: str, index: int, f1_threshold: float = 0.0) -> dict:
    """The verl-layout row of one question (a Search-R1 row is returned as it was read)."""
    if q.row is not None:
        return q.row
    extra = {
        "split": split,
        "index": index,
        "id": q.id,
        "question": q.question,
        "gold_titles": list(q.gold_titles),
    }
    if f1_threshold > 0:
        extra[F1_THRESHOLD_KEY] = float(f1_threshold)
    return {
        "prompt": [{"role": "user", "content": prompt + q.question}],
        "data_source": q.data_source,
        "ability": "qa",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(q.answers)}},
        "extra_info": extra,
    }


def read_all(paths: Sequence[str], field: str) -> list[Question]:
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise QuestionError(
            f"task.{field} is empty: give question files (NQ-open / HotpotQA "
            "JSON(L), Search-R1 parquet), e.g. "
            f"--config.task.{field}=path/nq_open_dev.jsonl"
        )
    out: list[Question] = []
    for p in paths:
        out.extend(read_questions(p))
    return out


def load_answerable(path: str) -> set[str]:
    """The question ids of an ``--answerable-out`` JSON file."""
    if not os.path.isfile(path):
        raise QuestionError(
            f"task.answerable_ids={path!r} does not exist; write it with "
            "`python -m tool_server.retrieval build ... --questions FILES "
            "--answerable-out FILE`"
        )
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("ids"), list):
        raise QuestionError(
            f"task.answerable_ids={path!r}: expected a JSON object with an "
            "'ids' list (the output of --answerable-out)"
        )
    return {str(i) for i in data["ids"]}


def split_questions(
    train: list[Question], evals: list[Question], num_train: int, num_eval: int, seed: int
) -> tuple[list[Question], list[Question]]:
    """(train, held-out eval): without eval questions, ``num_eval`` drawn from ``train``
    by ``seed``; no question (by id) in both; ``num_* = 0`` keeps all."""
    rng = random.Random(seed)
    if not evals:
        if num_eval >= len(train):
            raise QuestionError(
                f"task.num_eval={num_eval} leaves no training questions out "
                f"of {len(train)}; lower it or give task.eval_files"
            )
        order = list(range(len(train)))
        rng.shuffle(order)
        held = set(order[:num_eval])
        evals = [q for i, q in enumerate(train) if i in held]
        train = [q for i, q in enumerate(train) if i not in held]
    else:
        eval_ids = {q.id for q in evals}
        train = [q for q in train if q.id not in eval_ids]
        if num_eval:
            evals = evals[:num_eval]
    if num_train:
        train = train[:num_train]
    if not train:
        raise QuestionError("no training questions left after the held-out split")
    return train, evals


@dataclass(frozen=True)
class SearchQATask:
    """The ``task`` config section of retrieval QA (``vt_search``, ``vt_deepsearch``)."""

    name: str = "search_qa"
    prompt: str = "search_r1"  # search_r1 | deep_search
    train_files: tuple[str, ...] = ()  # NQ-open / HotpotQA JSON(L), Search-R1 parquet
    eval_files: tuple[str, ...] = ()  # empty: num_eval questions held out from train
    num_train: int = 0  # 0: all
    num_eval: int = 200
    answerable_ids: str = ""  # JSON of `build --answerable-out`: only those
    corpus_files: tuple[str, ...] = ()  # the corpus the index must have been built from
    f1_threshold: float = 0.0  # qa_correct: EM or F1 >= this (0: EM only)
    num_demos: int = 0  # SFT demonstrations (search, then answer); 0: none
    seed: int = 0


def check_retrieval(config) -> dict | None:
    """Fail before training if a local-index tool is configured without a usable index:
    ``tool_server.tool_opt.retrieval_index`` unset or missing, or built from another corpus
    than ``task.corpus_files``. Returns the index metadata (None when no tool needs one)."""
    ts = config.tool_server
    opts = dict(ts.tool_opt)
    uses_index = "search_retrieval" in ts.tools or (
        "web_search" in ts.tools and opts.get("web_search_backend", "local") == "local"
    )
    index = opts.get("retrieval_index") or ""
    if not uses_index or (ts.url and not index):
        return None  # a running server brings its own index
    corpus = tuple(config.task.corpus_files)
    if not index:
        raise RetrievalIndexError(
            "tool_server.tool_opt.retrieval_index is empty but the tools "
            f"{[t for t in ts.tools if t in INDEX_TOOLS]} search a local index; build one with "
            f"`{build_command('runs/qa_index', 'bm25', ' '.join(corpus) or '<corpus files>')}` "
            "and pass --config.tool_server.tool_opt.retrieval_index=runs/qa_index"
        )
    if not corpus:
        return read_meta(index)
    return check_index(index, corpus)


def search_action(question: str) -> str:
    """The demonstrated tool call: search for the question as asked (one line)."""
    return f"<search> {' '.join(question.split())} </search>"


def answer_from(observation: str, answers: Sequence[str]) -> str | None:
    """``<answer> A </answer>`` for the first gold answer ``A`` that ``observation``
    contains (normalised, whole tokens, as exact match compares); None when it contains
    none: a demonstration never answers from outside its evidence."""
    text = normalize_answer(observation)
    answer = next((a for a in answers if contains_normalized(text, [normalize_answer(a)])), None)
    return None if answer is None else f"<answer> {answer} </answer>"


def demonstrations(
    config, questions: Sequence[Question], rows: Sequence[dict], num_demos: int, seed: int
) -> list[dict]:
    """SFT rows for up to ``num_demos`` of ``questions`` (taken in an order shuffled by
    ``seed``, so every question file is represented): search the question, the search
    tool's real answer, :func:`answer_from` it (:mod:`verltool_jax.tasks.demonstrations`)."""
    from verltool_jax.tasks.demonstrations import Proposal, demonstrate

    order = list(range(len(questions)))
    random.Random(seed).shuffle(order)
    return demonstrate(
        config,
        [
            Proposal(
                rows[i],
                search_action(questions[i].question),
                lambda obs, answers=questions[i].answers: answer_from(obs, answers),
            )
            for i in order
        ],
        num_demos,
    )


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """Check the retrieval index, read and split the questions of ``config.task`` and write
    ``train.parquet`` / ``eval.parquet`` (and ``sft.parquet`` with ``task.num_demos``)
    under ``out_dir``."""
    t = config.task
    check_retrieval(config)
    prompt_name = t.prompt
    if prompt_name not in PROMPTS:
        raise ValueError(f"task.prompt={prompt_name!r} must be one of {sorted(PROMPTS)}")
    train = read_all(tuple(t.train_files), "train_files")
    evals = read_all(tuple(t.eval_files), "eval_files") if t.eval_files else []
    if t.answerable_ids:
        keep = load_answerable(t.answerable_ids)
        train = [q for q in train if q.id in keep]
        evals = [q for q in evals if q.id in keep]
    train, evals = split_questions(train, evals, t.num_train, t.num_eval, t.seed)
    threshold = t.f1_threshold
    prompt = PROMPTS[prompt_name]
    out = Path(out_dir)
    if t.num_demos < 0:
        raise ValueError(f"task.num_demos={t.num_demos} must be >= 0 (0: no demonstrations)")
    rows = [make_row(q, prompt, "train", i, threshold) for i, q in enumerate(train)]
    sft = demonstrations(config, train, rows, t.num_demos, t.seed) if t.num_demos else []
    return TaskFiles(
        train=write_rows(rows, out / "train.parquet"),
        eval=write_rows(
            [make_row(q, prompt, "eval", i, threshold) for i, q in enumerate(evals)],
            out / "eval.parquet",
        ),
        sft=write_rows(sft, out / "sft.parquet") if sft else None,
    )


TASK_CONFIG = SearchQATask


def eval_metrics(trajectories: Sequence[Any], tokenizer: Any) -> EvalReport:
    """EM, F1, searches and gold retrieved per test set
    (:func:`~verltool_jax.reporting.search_metrics.search_qa_metrics`)."""
    from verltool_jax.reporting.search_metrics import format_search_metrics, search_qa_metrics

    m = search_qa_metrics(trajectories, tokenizer=tokenizer)
    return EvalReport("search", "retrieval QA by data set", m, format_search_metrics(m))


EVAL_METRICS = eval_metrics
