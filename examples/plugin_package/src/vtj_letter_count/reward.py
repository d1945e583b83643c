"""The ``letter_count`` reward: 1.0 iff the last ``<answer>`` of the response is the
ground-truth count (an integer, surrounding spaces allowed), else 0.0."""

from __future__ import annotations

from typing import Any

from verltool_jax.rewards import RewardResult, extract_answer


def letter_count_reward(response_text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    """Exact integer match of ``<answer>N</answer>`` with ``ground_truth``."""
    answer = extract_answer(response_text)
    try:
        correct = answer is not None and int(answer.strip()) == int(ground_truth)
    except ValueError:  # an answer that is not an integer
        correct = False
    return RewardResult(float(correct), correct, {"has_answer": answer is not None})
