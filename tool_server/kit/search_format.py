"""The observation format shared by the search tools (``<search>`` tools and their reports).

``<information>Doc 1 (Title: t1) text1\\nDoc 2 (Title: t2) text2</information>``: one
line per document, numbered from 1 in rank order, newlines inside a text folded to
spaces so the numbering stays unambiguous. :func:`parse_information` reads such blocks
back (for reports and metrics).
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_information(docs: Iterable[tuple[str, str]]) -> str:
    """Format ``(title, text)`` pairs as an ``<information>`` block."""
    lines = [
        f"Doc {i} (Title: {_one_line(title)}) {_one_line(text)}"
        for i, (title, text) in enumerate(docs, 1)
    ]
    return "<information>" + "\n".join(lines) + "</information>"


def format_no_results(query: str) -> str:
    """The observation for a search that matched nothing (never an empty block)."""
    return f"<information>No results found for the query: {_one_line(query)}</information>"


def _title_end(line: str, start: int) -> int:
    """Index of the ``)`` closing ``(Title: `` (parentheses inside the title balanced)."""
    depth = 1
    for i in range(start, len(line)):
        if line[i] == "(":
            depth += 1
        elif line[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def parse_information(text: str) -> list[list[tuple[str, str]]]:
    """The documents of every ``<information>`` block in ``text``, one list per block, as
    ``(title, text)`` pairs (the inverse of :func:`format_information`; a "no results"
    block gives an empty list; a block cut short, e.g. by observation truncation, gives
    the documents it still holds)."""
    blocks = []
    for m in re.finditer(r"<information>(.*?)(?:</information>|\Z)", text or "", re.DOTALL):
        docs = []
        for line in m.group(1).split("\n"):
            head = re.match(r"Doc \d+ \(Title: ", line)
            if not head:
                continue
            end = _title_end(line, head.end())
            if end < 0:
                continue
            docs.append((line[head.end() : end], line[end + 1 :].strip()))
        blocks.append(docs)
    return blocks
