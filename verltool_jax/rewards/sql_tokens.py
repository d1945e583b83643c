"""A small SQL tokenizer shared by the SQL reward, the Spider hardness counter and the
MySQL-to-sqlite schema conversion.

Tokens are ``(kind, text)`` with kind one of ``str`` ('...' or "..." literals), ``ident``
(a backtick-quoted identifier, text without the backticks), ``num``, ``word`` (bare
words and keywords, original case), ``op`` (punctuation and operators) and ``ws``
(whitespace and comments, kept only with ``keep_ws=True``). Unterminated quotes raise
``ValueError`` naming the position.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

Token = tuple[str, str]

_OPS = ("<>", "!=", ">=", "<=", "||", "==")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NUM_RE = re.compile(r"(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def _quoted(sql: str, i: int, quote: str) -> tuple[str, int]:
    """The body of the quoted run starting at ``sql[i] == quote`` (doubled quotes and
    backslash escapes kept verbatim) and the index after it."""
    j = i + 1
    while j < len(sql):
        c = sql[j]
        if c == "\\" and quote != "`":
            j += 2
            continue
        if c == quote:
            if j + 1 < len(sql) and sql[j + 1] == quote:
                j += 2
                continue
            return sql[i + 1 : j], j + 1
        j += 1
    raise ValueError(f"unterminated {quote} quote at position {i}: {sql[i : i + 40]!r}")


def tokenize(sql: str, keep_ws: bool = False) -> list[Token]:
    """The tokens of ``sql`` (see the module doc)."""
    return list(_iter_tokens(sql, keep_ws))


def _iter_tokens(sql: str, keep_ws: bool) -> Iterator[Token]:
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c.isspace():
            j = i
            while j < n and sql[j].isspace():
                j += 1
            if keep_ws:
                yield ("ws", sql[i:j])
            i = j
        elif sql.startswith("--", i) or c == "#":
            j = sql.find("\n", i)
            j = n if j < 0 else j
            if keep_ws:
                yield ("ws", sql[i:j])
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            if keep_ws:
                yield ("ws", sql[i:j])
            i = j
        elif c in "'\"":
            body, i = _quoted(sql, i, c)
            yield ("str", c + body + c)
        elif c == "`":
            body, i = _quoted(sql, i, c)
            yield ("ident", body)
        elif c.isdigit() or (c == "." and i + 1 < n and sql[i + 1].isdigit()):
            m = _NUM_RE.match(sql, i)
            assert m is not None  # a digit, or "." then a digit, starts a number
            yield ("num", m.group(0))
            i = m.end()
        elif w := _WORD_RE.match(sql, i):
            yield ("word", w.group(0))
            i = w.end()
        else:
            op = next((o for o in _OPS if sql.startswith(o, i)), c)
            yield ("op", op)
            i += len(op)


def is_kw(tok: Token, *words: str) -> bool:
    """True if ``tok`` is a bare word equal (case-insensitively) to one of ``words``."""
    return tok[0] == "word" and tok[1].lower() in words


def top_level_order_by(sql: str) -> bool:
    """True if the query's outermost level has ``ORDER BY`` (a subquery's ORDER BY does
    not order the result). Spider's evaluation compares results order-sensitively only
    then."""
    depth = 0
    toks = tokenize(sql)
    for k, tok in enumerate(toks):
        if tok == ("op", "("):
            depth += 1
        elif tok == ("op", ")"):
            depth -= 1
        elif depth == 0 and is_kw(tok, "order") and k + 1 < len(toks) and is_kw(toks[k + 1], "by"):
            return True
    return False
