"""Answer-string normalisation shared by the QA rewards and the retrieval recall check.

``normalize_answer(s)`` (SQuAD): lower-case, drop punctuation, drop the articles
a/an/the, collapse whitespace. ``contains_answer(text, answer)``: the normalised answer
occurs in the normalised text as a whole-token run (so "1972" is found in "... December
1972 ..." but "art" is not found in "party"), the has-answer test of dense-passage
retrieval evaluations, here on SQuAD-normalised text instead of their own tokenizer.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation (see the module doc)."""
    s = "".join(ch for ch in str(s).lower() if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def contains_normalized(norm_text: str, answers: Iterable[str]) -> bool:
    """Whether an already-normalised ``norm_text`` holds one of the normalised ``answers``
    as a whole-token run (empty answers never match)."""
    padded = f" {norm_text} "
    return any(a and f" {a} " in padded for a in answers)


def contains_answer(text: str, answers: Iterable[str]) -> bool:
    """Whether ``text`` holds one of ``answers`` (both normalised; see the module doc)."""
    return contains_normalized(normalize_answer(text), [normalize_answer(a) for a in answers])
