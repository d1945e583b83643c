"""The rubric of ``vtj_reply_length`` as plain functions (no verifiers import), so the
tests can score a recorded reply the same way: every character of the reply counts."""

from __future__ import annotations

LENGTH_WEIGHT, DIGITS_WEIGHT = 1.0, 0.5


def length_score(reply: str) -> float:
    return min(len(reply), 100) / 100


def digits_score(reply: str) -> float:
    return sum(ch.isdigit() for ch in reply) / max(len(reply), 1)


def rubric(reply: str) -> float:
    """The episode's reward as verifiers sums it: score x weight over the rewards."""
    return LENGTH_WEIGHT * length_score(reply) + DIGITS_WEIGHT * digits_score(reply)
