"""Reward shaping on top of a task reward: a format penalty and tool-use terms.

    score = base
            - format_penalty                 if the response has no final answer
            + tool_use_bonus                 if the answer is correct and a tool was used
            + valid_tool_call_bonus          if at least one tool call was valid
            - invalid_tool_penalty * n_invalid_tool_calls

``valid_tool_call_bonus`` is VerlTool's deep-search term (+0.1 when the trajectory made a
valid tool call, whether or not the answer is right).
"""

from __future__ import annotations

from dataclasses import dataclass

from verltool_jax.rewards.base import RewardResult


@dataclass(frozen=True)
class ShapingSettings:
    format_penalty: float = 0.0
    tool_use_bonus: float = 0.0
    invalid_tool_penalty: float = 0.0
    valid_tool_call_bonus: float = 0.0


def shaped_score(
    base: RewardResult, settings: ShapingSettings, tool_calls: int = 0, invalid_tool_calls: int = 0
) -> float:
    """The shaped scalar reward (formula in the module doc)."""
    score = base.score
    if not base.info.get("has_answer", True):
        score -= settings.format_penalty
    if base.correct and tool_calls > 0:
        score += settings.tool_use_bonus
    if tool_calls - invalid_tool_calls > 0:
        score += settings.valid_tool_call_bonus
    score -= settings.invalid_tool_penalty * invalid_tool_calls
    return float(score)
