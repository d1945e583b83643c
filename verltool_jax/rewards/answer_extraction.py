"""Final-answer extraction: ``<answer>...</answer>`` and LaTeX ``\\boxed{...}``."""

from __future__ import annotations

from tool_server.kit.tags import last_tag_body


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; else None."""
    starts = [i for m in ("\\boxed{", "\\fbox{") for i in _find_all(text, m)]
    if not starts:
        return None
    start = max(starts)
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None  # unbalanced: no answer


def _find_all(text: str, needle: str) -> list[int]:
    out, i = [], text.find(needle)
    while i != -1:
        out.append(i)
        i = text.find(needle, i + 1)
    return out


def extract_answer(text: str, tag: str = "answer") -> str | None:
    """The final answer: the last ``<tag>`` body (its ``\\boxed{}`` if it has one), else
    the last ``\\boxed{}`` of the text, else None."""
    body = last_tag_body(text or "", tag)
    if body is not None:
        inner = last_boxed(body)
        return inner if inner is not None else body
    return last_boxed(text or "")
