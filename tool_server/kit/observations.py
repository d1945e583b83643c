"""Observation helpers shared by the server and the tools: truncation and the
standard invalid / error / timeout observations."""

from __future__ import annotations

from tool_server.kit.base import Observation

TRUNCATION_MARKER = "\n...[truncated {n} characters]...\n"


def truncate_text(text: str, max_chars: int) -> str:
    """Shorten ``text`` to at most ``max_chars`` characters, keeping the head and tail.

    If ``len(text) <= max_chars`` it is returned unchanged. Otherwise, with the marker
    ``m`` (which states the number ``n`` of characters dropped) and ``budget = max_chars
    - len(m)`` (``len(m)`` bounded by the marker for ``n = len(text)``), the result is ``text[:budget - budget//4] + m + text[len(text)-budget//4:]``
    (three quarters head, one quarter tail: a traceback's last line survives). A budget
    too small for the marker gives the bare head ``text[:max_chars]``.
    """
    if max_chars <= 0:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    if len(text) <= max_chars:
        return text
    # the marker for n = len(text) is at least as long as the real one (n is smaller)
    budget = max_chars - len(TRUNCATION_MARKER.format(n=len(text)))
    if budget < 8:
        return text[:max_chars]
    tail = budget // 4
    head = budget - tail
    marker = TRUNCATION_MARKER.format(n=len(text) - head - tail)
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def truncate_observation(obs: Observation, max_chars: int) -> Observation:
    """Apply :func:`truncate_text` to a string observation or to the ``obs`` of a dict one
    (the other keys are kept; ``metrics.truncated`` is not added to avoid surprises)."""
    if isinstance(obs, str):
        return truncate_text(obs, max_chars)
    if isinstance(obs, dict) and isinstance(obs.get("obs"), str):
        text = obs["obs"]
        if len(text) > max_chars:
            obs = dict(obs)
            obs["obs"] = truncate_text(text, max_chars)
        return obs
    return obs


def invalid_observation(reason: str, obs: str = "") -> dict:
    """An observation for an action nothing could run: ``{"obs": obs, "invalid_reason": reason}``."""
    return {"obs": obs, "invalid_reason": reason}


def normalize_observation(obs: object) -> Observation:
    """Coerce what a tool returned into a valid observation (a ``str`` or a dict with a
    string ``obs``); anything else is rendered with ``str``."""
    if isinstance(obs, str):
        return obs
    if isinstance(obs, dict):
        if not isinstance(obs.get("obs"), str):
            obs = dict(obs)
            obs["obs"] = "" if obs.get("obs") is None else str(obs["obs"])
        return obs
    return "" if obs is None else str(obs)
