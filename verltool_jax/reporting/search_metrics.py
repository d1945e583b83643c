"""Evaluation figures of the retrieval-QA families, from finished trajectories.

Per data set (``data["data_source"]``) and over all (``"all"``):

* ``n``: trajectories;
* ``em`` / ``f1``: mean exact match / token F1 of the final ``<answer>`` against the gold
  answers (:mod:`verltool_jax.rewards.qa_reward`; no answer scores 0);
* ``answered``: share with an ``<answer>``;
* ``searches``: mean number of search calls per question (actions with a complete
  ``<search>...</search>``);
* ``gold_retrieved`` (questions whose row lists ``extra_info.gold_titles``; ``n_gold``
  of them): share where at least one gold passage appeared in an observation's
  ``<information>`` block; ``gold_all_retrieved``: share where every gold passage did;
  passages are matched by title.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from tool_server.kit.search_format import parse_information
from tool_server.kit.tags import last_tag_body
from tool_server.retrieval.sources import clean_text
from verltool_jax.rewards.answer_extraction import extract_answer
from verltool_jax.rewards.qa_reward import exact_match, f1_score, gold_answers
from verltool_jax.rollout.response_text import model_text
from verltool_jax.rollout.trajectory import trajectory_field


def retrieved_titles(observations: Sequence[str]) -> list[list[str]]:
    """The titles of the documents in each observation (an empty list for other tools)."""
    return [
        [title for block in parse_information(obs) for title, _ in block] for obs in observations
    ]


def count_searches(actions: Sequence[str], tag: str = "search") -> int:
    """Actions holding a complete ``<tag>...</tag>``."""
    return sum(last_tag_body(a, tag) is not None for a in actions)


def trajectory_record(t: Any, text: str, tag: str = "search") -> dict:
    """The per-question figures of one trajectory (``text``: the model's own text)."""
    data = trajectory_field(t, "data") or {}
    golds = gold_answers(data["reward_model"]["ground_truth"])
    pred = extract_answer(text)
    gold_titles = {clean_text(x) for x in (data.get("extra_info") or {}).get("gold_titles") or ()}
    seen = {
        clean_text(x)
        for titles in retrieved_titles(trajectory_field(t, "observations") or [])
        for x in titles
    }
    rec = {
        "data_source": data.get("data_source", "?"),
        "answered": pred is not None,
        "em": exact_match(pred, golds) if pred is not None else 0.0,
        "f1": f1_score(pred, golds) if pred is not None else 0.0,
        "searches": count_searches(trajectory_field(t, "actions") or [], tag),
    }
    if gold_titles:
        rec["gold_any"] = bool(gold_titles & seen)
        rec["gold_all"] = gold_titles <= seen
    return rec


def search_qa_metrics(
    trajectories: Sequence[Any],
    texts: Sequence[str] | None = None,
    tokenizer=None,
    tag: str = "search",
) -> dict[str, dict]:
    """``{data_source | "all": {"n", "em", "f1", "answered", "searches"[, "n_gold",
    "gold_retrieved", "gold_all_retrieved"]}}`` (definitions in the module doc).
    ``texts``: the model's own text per trajectory; else decoded with ``tokenizer``."""
    trajs = list(trajectories)
    if texts is None:
        if tokenizer is None:
            raise ValueError("search_qa_metrics needs the model texts or a tokenizer")
        texts = [
            model_text(
                trajectory_field(t, "response_ids"), trajectory_field(t, "loss_mask"), tokenizer
            )
            for t in trajs
        ]
    if len(texts) != len(trajs):
        raise ValueError(f"{len(trajs)} trajectories but {len(texts)} texts")
    groups: dict[str, list[dict]] = defaultdict(list)
    for t, text in zip(trajs, texts):
        rec = trajectory_record(t, text, tag)
        groups[rec["data_source"]].append(rec)
        groups["all"].append(rec)
    out = {}
    for ds, recs in groups.items():
        n = len(recs)
        row = {
            "n": n,
            "em": sum(r["em"] for r in recs) / n,
            "f1": sum(r["f1"] for r in recs) / n,
            "answered": sum(r["answered"] for r in recs) / n,
            "searches": sum(r["searches"] for r in recs) / n,
        }
        gold = [r for r in recs if "gold_any" in r]
        if gold:
            row.update(
                n_gold=len(gold),
                gold_retrieved=sum(r["gold_any"] for r in gold) / len(gold),
                gold_all_retrieved=sum(r["gold_all"] for r in gold) / len(gold),
            )
        out[ds] = row
    return out


def format_search_metrics(table: Mapping[str, Mapping]) -> str:
    """The table as aligned text, one line per data set (``all`` last)."""
    cols = (
        "n",
        "em",
        "f1",
        "answered",
        "searches",
        "n_gold",
        "gold_retrieved",
        "gold_all_retrieved",
    )
    widths = [max(8, len(c) + 2) for c in cols]
    lines = [f"{'data set':<18}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths))]
    for ds in sorted(table, key=lambda d: (d == "all", d)):
        row = table[ds]
        cells = []
        for c, w in zip(cols, widths):
            v = row.get(c)
            cells.append(
                f"{'-':>{w}}"
                if v is None
                else f"{v:>{w}d}"
                if isinstance(v, int)
                else f"{v:>{w}.3f}"
            )
        lines.append(f"{ds:<18}" + "".join(cells))
    return "\n".join(lines)
