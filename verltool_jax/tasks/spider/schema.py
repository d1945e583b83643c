"""MySQL ``CREATE TABLE`` dump -> sqlite DDL (:func:`convert_schema`; the translation
rules are in the :mod:`verltool_jax.tasks.spider` package doc)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from verltool_jax.rewards.sql_tokens import Token, is_kw, tokenize


class SchemaConversionError(ValueError):
    """A schema statement could not be converted; the message quotes the statement."""


@dataclass
class ConvertedSchema:
    statements: list[str]  # sqlite DDL, in order
    tables: dict[str, list[str]]  # table -> column names
    notes: list[str] = field(default_factory=list)  # translations applied


def _split_statements(text: str) -> list[list[Token]]:
    """Statements (token lists without whitespace) separated by depth-0 ``;``."""
    out, cur = [], []
    for t in tokenize(text):
        if t == ("op", ";"):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        out.append(cur)
    return out


def _render(toks: Sequence[Token]) -> str:
    """Tokens back to sqlite text: identifiers double-quoted, single spaces between
    words, none around punctuation."""
    out = []
    prev: Token = ("", "")
    for kind, text in toks:
        s = '"' + text.replace('"', '""') + '"' if kind == "ident" else text
        type_args = s == "(" and prev[0] == "word" and prev[1].upper() not in _SPACED_BEFORE_PAREN
        if out and not (s in (",", ")", ".") or out[-1] in ("(", ".") or type_args):
            out.append(" ")
        out.append(s)
        prev = (kind, text)
    return "".join(out)


# keywords after which "(" starts a list, not a type's arguments: "KEY (a)", "INT(11)"
_SPACED_BEFORE_PAREN = {
    "KEY",
    "REFERENCES",
    "UNIQUE",
    "CHECK",
    "AND",
    "OR",
    "ON",
    "IN",
    "AS",
    "INDEX",
    "DEFAULT",
    "NOT",
    "EXISTS",
}


def _strip_qualifier(toks: list[Token]) -> list[Token]:
    """``db.t`` -> ``t`` (an identifier followed by ``.`` and another identifier)."""
    out, k = [], 0
    while k < len(toks):
        if (
            k + 2 < len(toks)
            and toks[k][0] in ("ident", "word")
            and toks[k + 1] == ("op", ".")
            and toks[k + 2][0] in ("ident", "word")
        ):
            out.append(toks[k + 2])
            k += 3
        else:
            out.append(toks[k])
            k += 1
    return out


def _as_ident(tok: Token) -> Token:
    return ("ident", tok[1]) if tok[0] in ("word", "ident") else tok


def _drop_mysql_column_words(item: list[Token], where: str, notes: list[str]) -> list[Token]:
    out, k = [], 0
    while k < len(item):
        t = item[k]
        if is_kw(t, "auto_increment", "unsigned", "zerofill"):
            notes.append(f"{where}: removed MySQL-only {t[1].upper()}")
            k += 1
        elif is_kw(t, "comment") and k + 1 < len(item) and item[k + 1][0] == "str":
            notes.append(f"{where}: removed COMMENT {item[k + 1][1]}")
            k += 2
        elif is_kw(t, "on") and k + 2 < len(item) and is_kw(item[k + 1], "update"):
            notes.append(f"{where}: removed ON UPDATE {item[k + 2][1]}")
            k += 3
        else:
            out.append(t)
            k += 1
    return out


def _create_table(
    toks: list[Token], stmt_text: str, notes: list[str]
) -> tuple[str, list[str], list[str]]:
    """One MySQL CREATE TABLE -> (sqlite CREATE TABLE, [CREATE INDEX ...], columns)."""
    toks = _strip_qualifier(toks)
    k = 2
    if (
        len(toks) > 5
        and is_kw(toks[2], "if")
        and is_kw(toks[3], "not")
        and is_kw(toks[4], "exists")
    ):
        k = 5
    if (
        k >= len(toks)
        or toks[k][0] not in ("ident", "word")
        or toks[k + 1 : k + 2] != [("op", "(")]
    ):
        raise SchemaConversionError(f"cannot read the table name of: {stmt_text}")
    table = toks[k][1]
    depth, end = 0, None
    for j in range(k + 1, len(toks)):
        if toks[j] == ("op", "("):
            depth += 1
        elif toks[j] == ("op", ")"):
            depth -= 1
            if depth == 0:
                end = j
                break
    if end is None:
        raise SchemaConversionError(f"unbalanced parentheses in: {stmt_text}")
    tail = toks[end + 1 :]
    if tail:
        notes.append(f"{table}: removed table options {_render(tail)!r}")
    items, cur, depth = [], [], 0
    for t in toks[k + 2 : end]:
        if t == ("op", "("):
            depth += 1
        elif t == ("op", ")"):
            depth -= 1
        if depth == 0 and t == ("op", ","):
            items.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        items.append(cur)
    defs, indexes, columns = [], [], []
    for item in items:
        head = item[0]
        if is_kw(head, "index", "key") or (
            is_kw(head, "unique", "fulltext") and len(item) > 1 and is_kw(item[1], "index", "key")
        ):
            unique = is_kw(head, "unique")
            rest = item[2:] if unique else item[1:]
            name = f"idx_{table}_{len(indexes)}"
            if rest and rest[0][0] in ("ident", "word") and rest[0] != ("op", "("):
                name = f"{table}_{rest[0][1]}"
                rest = rest[1:]
            cols = _render(rest)
            indexes.append(
                f'CREATE {"UNIQUE " if unique else ""}INDEX "{name}" ON "{table}" {cols}'
            )
            notes.append(f"{table}: inline {_render(item[:2])} -> CREATE INDEX")
        elif is_kw(head, "primary", "foreign", "unique", "constraint", "check"):
            defs.append(_render([_as_ident(t) if t[0] == "ident" else t for t in item]))
        elif head[0] in ("ident", "word"):
            columns.append(head[1])
            body = _drop_mysql_column_words(item[1:], f"{table}.{head[1]}", notes)
            defs.append(_render([("ident", head[1])] + body))
        else:
            raise SchemaConversionError(
                f"cannot convert the table item {_render(item)!r} of: {stmt_text}"
            )
    ddl = f'CREATE TABLE "{table}" (\n    ' + ",\n    ".join(defs) + "\n)"
    return ddl, indexes, columns


def convert_schema(text: str) -> ConvertedSchema:
    """MySQL ``schema.sql`` text -> sqlite statements (rules in the module doc)."""
    out = ConvertedSchema([], {})
    for toks in _split_statements(text):
        stmt_text = _render(toks)[:300]
        if len(toks) >= 2 and is_kw(toks[0], "create") and is_kw(toks[1], "table"):
            ddl, idx, cols = _create_table(toks, stmt_text, out.notes)
            name = re.match(r'CREATE TABLE "((?:[^"]|"")*)"', ddl).group(1)
            out.tables[name] = cols
            out.statements += [ddl] + idx
        elif is_kw(toks[0], "set", "use", "lock", "unlock", "drop"):
            out.notes.append(f"skipped MySQL session statement: {stmt_text}")
        else:
            raise SchemaConversionError(
                f"unsupported statement (only CREATE TABLE is converted): {stmt_text}"
            )
    return out
