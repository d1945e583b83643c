"""Extraction of tagged spans from an action (not a tool: ``_`` files are skipped).

Tools whose actions look like ``<search>query</search>`` use :func:`last_tag_body`:
the text of the **last complete** ``<tag>...</tag>`` pair in the turn (a model may write
several, or quote an earlier one; the last is the one it means to run).
"""
from __future__ import annotations

import functools
import re
from typing import Optional

_TAG_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")


@functools.lru_cache(maxsize=64)
def tag_regex(tag: str) -> re.Pattern:
    """The compiled ``<tag>(.*?)</tag>`` pattern (non-greedy, across newlines)."""
    if not _TAG_NAME_RE.fullmatch(tag or ""):
        raise ValueError(f"tag name {tag!r} is not valid; use letters, digits and _ . : - "
                         "(e.g. 'search')")
    t = re.escape(tag)
    return re.compile(rf"<{t}>(.*?)</{t}>", re.DOTALL)


def last_tag_body(text: str, tag: str) -> Optional[str]:
    """The stripped text inside the last complete ``<tag>...</tag>`` of ``text``, or
    ``None`` when there is none (an empty pair gives ``""``)."""
    bodies = tag_regex(tag).findall(text or "")
    return bodies[-1].strip() if bodies else None
