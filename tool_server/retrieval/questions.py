"""Question files of the retrieval-QA data sets, read in their upstream layouts.

``read_questions(path)`` returns :class:`Question` records from:

* NQ-open JSONL: ``{"question": str, "answer": [str, ...]}``;
* HotpotQA (original layout, JSON list or JSONL): ``question``, ``answer`` (a string),
  ``_id``, ``context`` and ``supporting_facts`` (the gold paragraphs: the context
  paragraphs whose title is a supporting fact);
* IRCoT JSONL (``question_id``, ``question_text``, ``answers_objects[].spans``,
  ``contexts[]`` with ``is_supporting``);
* any JSON/JSONL with ``question`` and ``answer`` / ``answers`` / ``golden_answers``
  (a string or a list);
* Search-R1's parquet rows (``prompt``, ``data_source``,
  ``reward_model.ground_truth.target``, ``extra_info.question``).

A question's id is the row's own (``question_id``, ``_id``, ``id``), else
``<file stem>-<row>`` (Search-R1 rows: ``<data_source>[-<split>]-<index>``).
A question's gold passages are given as corpus ids (:func:`.sources.passage_id`) and
titles. A row without a question or without any answer is an error naming file, row and
field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .sources import hotpot_paragraphs, json_records, passage_id

ANSWER_FIELDS = ("answer", "answers", "golden_answers")
# File-name fragments -> the data_source name Search-R1 uses for that data set.
KNOWN_DATASETS = (
    ("hotpot", "hotpotqa"),
    ("2wiki", "2wikimultihopqa"),
    ("musique", "musique"),
    ("nq", "nq"),
    ("triviaqa", "triviaqa"),
    ("popqa", "popqa"),
    ("bamboogle", "bamboogle"),
)


class QuestionError(ValueError):
    """A question row that cannot be used; the message names the file, row and field."""


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: tuple[str, ...]
    data_source: str
    gold_ids: tuple[str, ...] = ()
    gold_titles: tuple[str, ...] = ()
    row: dict | None = field(default=None, compare=False, repr=False)  # a Search-R1 row as read


def dataset_name(path: str | os.PathLike) -> str:
    """The data_source for a file: a known data set named in the file name, else its stem."""
    stem = Path(path).name.lower()
    for fragment, name in KNOWN_DATASETS:
        if fragment in stem:
            return name
    return Path(path).stem


def _answers(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        for key in ("target", "answers", "answer"):
            if key in value:
                return _answers(value[key])
        return []
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        return [str(v) for v in value if v is not None and str(v).strip()]
    return [str(value)] if str(value).strip() else []


def _missing(where: str, field_name: str, fix: str) -> QuestionError:
    return QuestionError(f"{where}: field {field_name!r} is missing or empty; {fix}")


def question_from_record(r: Any, index: int, path: str, data_source: str) -> Question:
    """One question of a JSON/JSONL file (layouts in the module doc)."""
    where = f"{path} row {index}"
    if not isinstance(r, dict):
        raise QuestionError(f"{where}: expected a JSON object, got {type(r).__name__}")
    gold_ids: tuple[str, ...] = ()
    gold_titles: tuple[str, ...] = ()
    if "question_text" in r:  # IRCoT
        text, qid = r["question_text"], r.get("question_id")
        answers = [
            s
            for obj in (r.get("answers_objects") or [])
            if isinstance(obj, dict)
            for s in _answers(obj.get("spans"))
        ]
        answer_field = "answers_objects[].spans"
    else:
        text, qid = r.get("question"), r.get("_id", r.get("id", r.get("question_id")))
        answer_field = next((f for f in ANSWER_FIELDS if f in r), "answer")
        answers = _answers(r.get(answer_field))
    if not isinstance(text, str) or not text.strip():
        raise _missing(
            where,
            "question_text" if "question_text" in r else "question",
            "every row needs the question text",
        )
    if not answers:
        raise _missing(
            where,
            answer_field,
            "every question needs at least one gold answer "
            "(a string or a list of strings); drop the row or add its answer",
        )
    if "contexts" in r or "context" in r:
        gold = [(t, x) for t, x, is_gold in hotpot_paragraphs(r, where) if is_gold]
        gold_ids = tuple(dict.fromkeys(passage_id(t, x) for t, x in gold))
        gold_titles = tuple(dict.fromkeys(t for t, _ in gold))
    return Question(
        id=str(qid) if qid is not None else f"{Path(path).stem}-{index}",
        question=text.strip(),
        answers=tuple(answers),
        data_source=data_source,
        gold_ids=gold_ids,
        gold_titles=gold_titles,
    )


def question_from_search_r1_row(row: dict, index: int, path: str) -> Question:
    """One question of a Search-R1 parquet row; the row itself is kept in ``.row``."""
    where = f"{path} row {index}"
    gt = (row.get("reward_model") or {}).get("ground_truth")
    answers = _answers(gt)
    if not answers:
        raise _missing(
            where,
            "reward_model.ground_truth.target",
            "every question needs at least one gold answer",
        )
    extra = row.get("extra_info") or {}
    text = extra.get("question")
    if not text:
        users = [m.get("content", "") for m in (row.get("prompt") or []) if m.get("role") == "user"]
        text = users[-1] if users else ""
    if not text:
        raise _missing(
            where,
            "extra_info.question",
            "the row needs its question (or a user message in 'prompt')",
        )
    ds = row.get("data_source")
    if not isinstance(ds, str) or not ds:
        raise _missing(where, "data_source", "Search-R1 rows name their data set")
    qid = row.get("id", extra.get("index", index))
    split = extra.get("split")
    return Question(
        id=f"{ds}-{split}-{qid}" if split else f"{ds}-{qid}",
        question=str(text).strip(),
        answers=tuple(answers),
        data_source=ds,
        row=row,
    )


def _json_records(path: str) -> list:
    return json_records(path, QuestionError, whole_file=not path.endswith(".jsonl"))


def read_questions(path: str | os.PathLike, data_source: str | None = None) -> list[Question]:
    """The questions of one file (layouts in the module doc); ``data_source`` defaults to
    :func:`dataset_name` (Search-R1 rows keep their own)."""
    path = str(path)
    if not os.path.isfile(path):
        raise QuestionError(f"question file {path!r} does not exist")
    if path.endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        return [question_from_search_r1_row(r, i, path) for i, r in enumerate(rows)]
    ds = data_source or dataset_name(path)
    return [question_from_record(r, i, path, ds) for i, r in enumerate(_json_records(path))]
