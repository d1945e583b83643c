"""The observation format shared by the search tools.

``<information>Doc 1 (Title: t1) text1\\nDoc 2 (Title: t2) text2</information>``: one
line per document, numbered from 1 in rank order, newlines inside a text folded to
spaces so the numbering stays unambiguous.
"""
from __future__ import annotations

from typing import Iterable


def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_information(docs: Iterable[tuple[str, str]]) -> str:
    """Format ``(title, text)`` pairs as an ``<information>`` block."""
    lines = [f"Doc {i} (Title: {_one_line(title)}) {_one_line(text)}"
             for i, (title, text) in enumerate(docs, 1)]
    return "<information>" + "\n".join(lines) + "</information>"


def format_no_results(query: str) -> str:
    """The observation for a search that matched nothing (never an empty block)."""
    return f"<information>No results found for the query: {_one_line(query)}</information>"
