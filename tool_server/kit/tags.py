"""Extraction of tagged spans from an action (not a tool: ``_`` files are skipped).

Tools whose actions look like ``<search>query</search>`` use :func:`last_tag_body`:
the text of the **last complete** ``<tag>...</tag>`` pair in the turn (a model may write
several, or quote an earlier one; the last is the one it means to run).

Every scan here takes time linear in the length of the text (a model can write 100 KB of
opening tags with no closing one; a backtracking regex such as ``<t>(.*?)</t>`` would
rescan the rest of the text from every opening tag).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

_TAG_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")
_FENCE_LANG_RE = re.compile(r"([A-Za-z0-9_+-]*)[ \t]*\n")


@functools.lru_cache(maxsize=64)
def tag_regex(tag: str) -> re.Pattern:
    """The compiled ``<tag>(.*?)</tag>`` pattern (non-greedy, across newlines); also the
    validation of a tag name (``ValueError`` naming the allowed characters)."""
    if not _TAG_NAME_RE.fullmatch(tag or ""):
        raise ValueError(
            f"tag name {tag!r} is not valid; use letters, digits and _ . : - (e.g. 'search')"
        )
    t = re.escape(tag)
    return re.compile(rf"<{t}>(.*?)</{t}>", re.DOTALL)


def delimited_bodies(text: str, opening: str, closing: str) -> list[str]:
    """The texts between ``opening`` and the next ``closing``, left to right, without
    overlap: what ``re.findall(escape(opening) + "(.*?)" + escape(closing), text, DOTALL)``
    returns, in linear time (one pass of ``str.find``; once an opening has no closing
    after it, no later one can have one either)."""
    out: list[str] = []
    pos = 0
    while True:
        start = text.find(opening, pos)
        if start < 0:
            return out
        body_start = start + len(opening)
        end = text.find(closing, body_start)
        if end < 0:
            return out
        out.append(text[body_start:end])
        pos = end + len(closing)


def tag_bodies(text: str, tag: str) -> list[str]:
    """Every complete ``<tag>...</tag>`` body of ``text``, in order (unstripped)."""
    tag_regex(tag)
    return delimited_bodies(text or "", f"<{tag}>", f"</{tag}>")


def last_tag_body(text: str, tag: str) -> str | None:
    """The stripped text inside the last complete ``<tag>...</tag>`` of ``text``, or
    ``None`` when there is none (an empty pair gives ``""``)."""
    bodies = tag_bodies(text, tag)
    return bodies[-1].strip() if bodies else None


def fenced_blocks(text: str, langs: Iterable[str]) -> list[str]:
    """The bodies of Markdown code fences whose language is one of ``langs``: what
    ``re.findall(r"```(?:LANGS)[ \\t]*\\n(.*?)```", text, DOTALL)`` returns, in linear time."""
    wanted = set(langs)
    text = text or ""
    out: list[str] = []
    pos = 0
    while True:
        start = text.find("```", pos)
        if start < 0:
            return out
        m = _FENCE_LANG_RE.match(text, start + 3)
        if m is None or m.group(1) not in wanted:
            pos = start + 1
            continue
        end = text.find("```", m.end())
        if end < 0:
            return out
        out.append(text[m.end() : end])
        pos = end + 3
