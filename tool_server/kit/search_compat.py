"""``search_retrieval`` under ``--compat verltool``: VerlTool's parsing and observation
(not a tool: ``_`` files are skipped).

Follows VerlTool's ``verl_tool/servers/tools/search_retrieval.py`` (Search-R1's format):

* action: with ``</search>`` in it, the last ``<search>...</search>`` body (stripped,
  possibly empty) is a search; else, with ``</answer>`` in it, the last
  ``<answer>...</answer>`` is a final answer; else not this tool's action;
* search: ``"\\n\\n<information>{docs}</information>\\n\\n"`` with done=False, valid=True,
  where ``docs`` is, stripped, the concatenation over the hits (rank i from 1) of
  ``"Doc {i}(Title: {first line}) {other lines}\\n"`` of the hit's Search-R1 ``contents``.
  A document here has a separate title, so its Search-R1 ``contents`` is taken to be
  ``title + "\\n" + text`` (just ``text`` when the title is empty), which is how a
  Search-R1 corpus stores it; an empty ``contents`` gives ``No title`` / ``No content``.
  A failing search gives no documents (VerlTool's retriever client returns none on an
  error);
* final answer: ``("", done=True, valid=False)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_SEARCH_RE = re.compile(r"<search>(.*?)</search>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class CompatAction:
    """``kind`` is ``"search"`` or ``"answer"``; ``text`` the stripped tag body."""

    kind: str
    text: str


def parse(action: str) -> CompatAction | None:
    """The action as VerlTool's search tool reads it (module docstring), or None."""
    for kind, close, pattern in (
        ("search", "</search>", _SEARCH_RE),
        ("answer", "</answer>", _ANSWER_RE),
    ):
        if close in action:
            bodies = pattern.findall(action)
            if bodies:
                return CompatAction(kind, bodies[-1].strip())
    return None


def search_r1_contents(title: str, text: str) -> str:
    """A document's Search-R1 ``contents``: the title line, then the text."""
    return f"{title}\n{text}" if title else text


def format_information(docs: Iterable[tuple[str, str]]) -> str:
    """The observation for ``(title, text)`` hits in rank order (module docstring)."""
    out = ""
    for i, (title, text) in enumerate(docs, 1):
        contents = search_r1_contents(title, text)
        lines = contents.split("\n")
        head = lines[0] if contents else "No title"
        body = "\n".join(lines[1:]) if contents else "No content"
        out += f"Doc {i}(Title: {head}) {body}\n"
    return f"\n\n<information>{out.strip()}</information>\n\n"
