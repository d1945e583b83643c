"""Retrieval recall of a built index on question files: can the corpus answer them?

For each question the question text is the query and the top ``max(ks)`` documents are
retrieved once. Per data set (``data_source``) and ``k``:

* ``answer_recall@k`` = share of questions with a gold answer string in one of the top-k
  documents (:func:`.answers.contains_answer`: whole-token match after SQuAD
  normalisation of title + text);
* ``gold_recall@k`` (questions with known gold passages only, e.g. HotpotQA) = mean over
  questions of ``|gold ∩ top-k| / |gold|``, gold passages matched by corpus id;
* ``gold_any@k`` = share of those questions with at least one gold passage in the top k.

The questions "whose answer the corpus holds" are those with an answer string in the top
``answerable_k`` documents: :func:`answerable_ids`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from .answers import contains_normalized, normalize_answer
from .questions import Question

DEFAULT_KS = (1, 3, 5, 10)


def _doc_id(d) -> str:
    return getattr(d, "doc_id", None) or d.id


def answer_hit_ranks(question: Question, ranked: Sequence, cache: dict | None = None) -> int | None:
    """The 1-based rank of the first document holding an answer, or None."""
    answers = [normalize_answer(a) for a in question.answers]
    for rank, d in enumerate(ranked, 1):
        key = _doc_id(d)
        norm = cache.get(key) if cache is not None else None
        if norm is None:
            norm = normalize_answer(f"{d.title} {d.contents}")
            if cache is not None:
                cache[key] = norm
        if contains_normalized(norm, answers):
            return rank
    return None


def recall_at_k(
    questions: Sequence[Question], ranked: Sequence[Sequence], ks: Sequence[int] = DEFAULT_KS
) -> dict:
    """``{data_source: {"n", "answer_recall@k", ["n_gold", "gold_recall@k", "gold_any@k"]}}``
    for ranked documents (objects with ``id``/``doc_id``, ``title``, ``contents``) per
    question, best first (formulas in the module doc)."""
    if len(questions) != len(ranked):
        raise ValueError(f"{len(questions)} questions but {len(ranked)} rankings")
    ks = sorted(set(int(k) for k in ks))
    cache: dict = {}
    groups: dict[str, dict] = {}
    for q, docs in zip(questions, ranked):
        g = groups.setdefault(
            q.data_source,
            {
                "n": 0,
                "n_gold": 0,
                "ans": [0] * len(ks),
                "gold": [0.0] * len(ks),
                "any": [0] * len(ks),
            },
        )
        g["n"] += 1
        hit = answer_hit_ranks(q, docs, cache)
        for j, k in enumerate(ks):
            g["ans"][j] += int(hit is not None and hit <= k)
        if q.gold_ids:
            g["n_gold"] += 1
            gold = set(q.gold_ids)
            for j, k in enumerate(ks):
                found = gold & {_doc_id(d) for d in docs[:k]}
                g["gold"][j] += len(found) / len(gold)
                g["any"][j] += int(bool(found))
    out = {}
    for ds, g in groups.items():
        row: dict = {"n": g["n"]}
        for j, k in enumerate(ks):
            row[f"answer_recall@{k}"] = g["ans"][j] / g["n"]
        if g["n_gold"]:
            row["n_gold"] = g["n_gold"]
            for j, k in enumerate(ks):
                row[f"gold_recall@{k}"] = g["gold"][j] / g["n_gold"]
                row[f"gold_any@{k}"] = g["any"][j] / g["n_gold"]
        out[ds] = row
    return out


def answerable_ids(questions: Sequence[Question], ranked: Sequence[Sequence], k: int) -> list[str]:
    """Ids of the questions with a gold answer string in their top ``k`` documents."""
    cache: dict = {}
    return [
        q.id
        for q, docs in zip(questions, ranked)
        if answer_hit_ranks(q, docs[:k], cache) is not None
    ]


def retrieve_all(
    service, questions: Sequence[Question], k: int, batch_size: int = 128
) -> list[list]:
    """The top-``k`` hits of every question (its text as the query), in batches."""
    out: list[list] = []
    for start in range(0, len(questions), batch_size):
        chunk = questions[start : start + batch_size]
        out.extend(service.search_batch([q.question for q in chunk], k))
    return out


def format_recall_table(table: dict, ks: Iterable[int]) -> str:
    """The recall figures as aligned text lines, one per data set and measure."""
    ks = sorted(set(ks))
    lines = [f"{'data set':<18}{'measure':<15}{'n':>6}" + "".join(f"{'@' + str(k):>8}" for k in ks)]
    for ds, row in sorted(table.items()):
        for measure, n_key in (
            ("answer_recall", "n"),
            ("gold_recall", "n_gold"),
            ("gold_any", "n_gold"),
        ):
            if f"{measure}@{ks[0]}" in row:
                lines.append(
                    f"{ds:<18}{measure:<15}{row[n_key]:>6}"
                    + "".join(f"{row[f'{measure}@{k}']:>8.3f}" for k in ks)
                )
    return "\n".join(lines)


def write_answerable(path: str, ids: Sequence[str], meta: dict) -> None:
    """Write ``{"ids": [...], **meta}`` as JSON (read by the QA data preparation)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**meta, "ids": list(ids)}, f, indent=1)
