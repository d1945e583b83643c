"""Math: the final answer (``<answer>`` or ``\\boxed{}``) against the ground truth.

Equivalence, in order: equal after normalisation (strip ``$``, spaces, thousands
commas, a trailing period); equal as numbers (integers and fractions exactly, decimals
to a relative 1e-9); symbolically equal per ``math_verify`` (sympy) when neither is a
plain number. Reward = 1 if equivalent else 0.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Any

from verltool_jax.rewards.answer_extraction import extract_answer
from verltool_jax.rewards.base import RewardResult, register_reward

_NUM_RE = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")
_FRAC_RE = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")


def normalize(s: str) -> str:
    """Strip ``$``, ``\\!``, spaces, ``\\left``/``\\right``, thousands commas, final '.'."""
    s = str(s).strip().replace("$", "").replace("\\!", "").replace("\\left", "")
    s = s.replace("\\right", "").replace(" ", "").rstrip(".")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def as_number(s: str) -> Fraction | None:
    """``s`` as an exact number (int, decimal, ``a/b`` or ``\\frac{a}{b}``), else None."""
    s = normalize(s)
    m = _FRAC_RE.fullmatch(s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    parts = s.split("/")
    try:
        if len(parts) == 2 and all(_NUM_RE.fullmatch(p) for p in parts):
            return Fraction(parts[0]) / Fraction(parts[1])
        if _NUM_RE.fullmatch(s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def numbers_equal(a: Fraction, b: Fraction, rel_tol: float = 1e-9) -> bool:
    """Exact for rationals written exactly; |a-b| <= rel_tol * max(|a|,|b|) otherwise."""
    return a == b or abs(a - b) <= rel_tol * max(abs(a), abs(b))


class _NoTimeoutWarning:
    """Drops math-verify's per-call "Timeout is disabled" warning (our timer is in charge)."""

    @staticmethod
    def filter(record) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


def _quiet_math_verify() -> None:
    import logging

    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTimeoutWarning) for f in logger.filters):
            logger.addFilter(_NoTimeoutWarning())


def symbolic_equal(pred: str, gold: str) -> bool:
    """``math_verify.verify(parse(gold), parse(pred))``.

    math-verify's own timeouts use ``signal.alarm``, which works only in a main thread
    and would cancel an enclosing timer (the reward pool's per-item SIGALRM timer), so
    they are used only when no such timer is armed; otherwise the enclosing one rules.
    """
    import signal

    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    outer_timer = main and signal.getitimer(signal.ITIMER_REAL)[0] > 0
    t = 5 if main and not outer_timer else None
    if t is None:
        _quiet_math_verify()
    g = parse(f"${gold}$", parsing_timeout=t)
    p = parse(f"${pred}$", parsing_timeout=t)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=t))


def warm_up() -> None:
    """Pay math-verify's one-off LaTeX parser set-up (seconds) now, not in a timed call."""
    symbolic_equal("x^2+2x+1", "(x+1)^2")


def math_equivalent(pred: str, gold: Any) -> bool:
    """Whether ``pred`` and ``gold`` are the same answer (see the module doc)."""
    gold = str(gold)
    if normalize(pred) == normalize(gold):
        return True
    a, b = as_number(pred), as_number(gold)
    if a is not None and b is not None:
        return numbers_equal(a, b)
    return symbolic_equal(pred, gold)


@register_reward(
    "math",
    "tiny_math",
    "tiny_lookup",
    "math",
    "gsm8k",
    "openai/gsm8k",
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "deepscaler",
    "aime",
    "math_dapo",
    "amc",
    "svamp",
    "mawps",
)
def math_reward(response_text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    """1.0 if the extracted final answer is equivalent to ``ground_truth``, else 0.0."""
    pred = extract_answer(response_text)
    if pred is None:
        return RewardResult(0.0, False, {"pred": None, "has_answer": False})
    ok = math_equivalent(pred, ground_truth)
    return RewardResult(float(ok), ok, {"pred": pred, "has_answer": True})
