"""The visual-reasoning reward (Pixel-Reasoner, as VerlTool trains it).

Per trajectory ``i`` of a group (the ``n`` samples of one prompt), with ``acc_i`` in {0, 1}
the answer's correctness, ``v_i`` its number of valid tool calls and
``r_g = mean_j [v_j > 0]`` the group's tool-call rate::

    score_i = acc_i
              + alpha * [v_i > 0] * max(0, H - r_g)        curiosity bonus
              + beta * min(n_vo - v_i, 0)                  penalty per call beyond n_vo

Defaults follow VerlTool's ``pixel_reasoner`` reward manager (the paper's values): ``H =
0.3``, ``alpha = 0.5``, ``n_vo = 1``, ``beta = 0.05``. The bonus pays a trajectory for using
a tool only while fewer than ``H`` of its group do, so exploration of the tool is rewarded
until it is common, and each call past the first costs ``beta``. Correctness is ours: the
``<answer>...</answer>`` text (or the last ``\\boxed{}``) equals the gold answer after
lower-casing and trimming (easy-VQA answers are single words; VerlTool uses math-verify).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from verltool_jax import metric_names as names
from verltool_jax.rewards.answer_extraction import extract_answer, last_boxed
from verltool_jax.rewards.base import RewardResult, register_reward


@dataclass(frozen=True)
class CuriositySettings:
    """The Pixel-Reasoner shaping constants (see the module doc)."""

    rate_bound: float = 0.3  # H
    alpha: float = 0.5
    free_calls: int = 1  # n_vo
    beta: float = 0.05


def normalise_answer(text: str | None) -> str | None:
    return None if text is None else " ".join(text.strip().strip(".").lower().split())


def visual_answer(response_text: str) -> str | None:
    """The final answer: ``<answer>...</answer>``, else the last ``\\boxed{...}``."""
    a = extract_answer(response_text)
    return normalise_answer(a if a is not None else last_boxed(response_text))


@register_reward("visual_answer", "easy_vqa")
def visual_answer_reward(response_text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    """1.0 iff the extracted answer equals one of the gold answers (normalised)."""
    golds = ground_truth if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    pred = visual_answer(response_text)
    ok = pred is not None and pred in {normalise_answer(str(g)) for g in golds}
    return RewardResult(float(ok), ok, {"pred": pred, "has_answer": pred is not None})


def curiosity_terms(
    valid_calls: Sequence[int], settings: CuriositySettings = CuriositySettings()
) -> list[tuple[float, float]]:
    """``(curiosity bonus, redundancy penalty)`` of each trajectory of one group (module doc)."""
    if not valid_calls:
        return []
    rate = sum(1 for v in valid_calls if v > 0) / len(valid_calls)
    s = settings
    return [
        (s.alpha * float(v > 0) * max(0.0, s.rate_bound - rate), s.beta * min(s.free_calls - v, 0))
        for v in valid_calls
    ]


def group_scores(
    correct: Sequence[bool],
    valid_calls: Sequence[int],
    settings: CuriositySettings = CuriositySettings(),
) -> list[float]:
    """``score_i`` of every trajectory of one group (module doc)."""
    if len(correct) != len(valid_calls):
        raise ValueError(f"correct has {len(correct)} entries, valid_calls {len(valid_calls)}")
    return [float(c) + b + p for c, (b, p) in zip(correct, curiosity_terms(valid_calls, settings))]


def curiosity_settings(reward: Any) -> CuriositySettings | None:
    """The group terms a run's ``reward`` config section asks for (``curiosity_alpha``,
    ``curiosity_rate_bound``, ``free_tool_calls``, ``extra_call_penalty``), or None when
    both terms are off."""
    if reward.curiosity_alpha == 0 and reward.extra_call_penalty == 0:
        return None
    return CuriositySettings(
        rate_bound=reward.curiosity_rate_bound,
        alpha=reward.curiosity_alpha,
        free_calls=reward.free_tool_calls,
        beta=reward.extra_call_penalty,
    )


def add_curiosity_terms(
    groups: Iterable[Sequence[Any]], settings: CuriositySettings = CuriositySettings()
) -> dict[str, float]:
    """Add each trajectory's curiosity bonus and extra-call penalty (:func:`curiosity_terms`
    over its group, ``v_i`` = valid tool calls = ``tool_calls - invalid_tool_calls``) to its
    ``reward`` and record both in ``reward_info``; trajectories without a reward (failed
    ones) are left out of their group. Returns the batch means
    ``{"reward/curiosity_bonus", "reward/extra_call_penalty"}``."""
    bonus, penalty = [], []
    for g in groups:
        scored = [t for t in g if t.reward is not None]
        calls = [t.tool_calls - t.invalid_tool_calls for t in scored]
        for t, (b, p) in zip(scored, curiosity_terms(calls, settings)):
            t.reward = float(t.reward) + b + p
            t.reward_info = dict(t.reward_info or {}, curiosity_bonus=b, extra_call_penalty=p)
            bonus.append(b)
            penalty.append(p)
    n = max(len(bonus), 1)
    return {names.CURIOSITY_BONUS: sum(bonus) / n, names.EXTRA_CALL_PENALTY: sum(penalty) / n}
