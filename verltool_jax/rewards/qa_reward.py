"""Question answering: SQuAD-normalised exact match and token F1 against gold answers.

normalize(s) = lower-case, drop punctuation, drop the articles a/an/the, collapse
whitespace. EM = 1 if normalize(pred) == normalize(g) for some gold g.
F1 = max over g of 2PR/(P+R) on normalised token bags (P = common/|pred|, R = common/|g|).
``qa_correct``: 1 if EM, or if F1 >= a threshold the row sets (answer correctness).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from tool_server.retrieval.answers import normalize_answer
from verltool_jax.rewards.answer_extraction import extract_answer
from verltool_jax.rewards.base import RewardResult, register_reward

__all__ = [
    "normalize_answer",
    "gold_answers",
    "exact_match",
    "f1_score",
    "qa_em_reward",
    "qa_f1_reward",
    "qa_correct_reward",
]


def gold_answers(ground_truth: Any) -> list[str]:
    """Gold answers from a string, a list, or a dict with ``target``/``answers``."""
    if isinstance(ground_truth, dict):
        for key in ("target", "answers", "answer"):
            if key in ground_truth:
                return gold_answers(ground_truth[key])
        raise ValueError(
            "QA ground_truth dict needs a 'target' (or 'answers') field, got "
            f"keys {sorted(ground_truth)}"
        )
    if isinstance(ground_truth, (list, tuple)) or type(ground_truth).__name__ == "ndarray":
        return [str(g) for g in ground_truth]
    return [str(ground_truth)]


def exact_match(pred: str, golds: Sequence[str]) -> float:
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in golds))


def f1_score(pred: str, golds: Sequence[str]) -> float:
    ptoks = normalize_answer(pred).split()
    best = 0.0
    for g in golds:
        gtoks = normalize_answer(g).split()
        common = sum((Counter(ptoks) & Counter(gtoks)).values())
        if common == 0:
            continue
        p, r = common / len(ptoks), common / len(gtoks)
        best = max(best, 2 * p * r / (p + r))
    return best


def _qa(response_text: str, ground_truth: Any, use_f1: bool) -> RewardResult:
    pred = extract_answer(response_text)
    golds = gold_answers(ground_truth)
    if pred is None:
        return RewardResult(0.0, False, {"pred": None, "has_answer": False, "em": 0.0, "f1": 0.0})
    em, f1 = exact_match(pred, golds), f1_score(pred, golds)
    return RewardResult(
        f1 if use_f1 else em, em == 1.0, {"pred": pred, "has_answer": True, "em": em, "f1": f1}
    )


@register_reward(
    "qa_em",
    "nq",
    "triviaqa",
    "popqa",
    "hotpotqa",
    "2wikimultihopqa",
    "musique",
    "bamboogle",
    "searchR1_",
)
def qa_em_reward(response_text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    """Exact match (0/1) of the extracted answer."""
    return _qa(response_text, ground_truth, use_f1=False)


@register_reward("qa_f1")
def qa_f1_reward(response_text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    """Token F1 of the extracted answer (correct = exact match)."""
    return _qa(response_text, ground_truth, use_f1=True)


F1_THRESHOLD_KEY = "answer_f1_threshold"


@register_reward("qa_correct")
def qa_correct_reward(response_text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    """Answer correctness (0/1): exact match, or token F1 >= ``extra_info["answer_f1_threshold"]``
    when the row sets a threshold > 0 (the deep-search data preparation writes it)."""
    res = _qa(response_text, ground_truth, use_f1=False)
    threshold = float((extra_info or {}).get(F1_THRESHOLD_KEY) or 0.0)
    correct = res.info["em"] == 1.0 or (threshold > 0 and res.info["f1"] >= threshold)
    return RewardResult(float(correct), correct, dict(res.info, f1_threshold=threshold))
