"""Spider (MySQL dump layout) to sqlite, the gold-query check, and VT-SQL rows.

Input layout (``--spider-dir``)::

    test_queries.csv, train_queries.csv      columns: database, question, sql
    databases/<db>/schema.sql                MySQL CREATE TABLE statements
    databases/<db>/data/<table>.csv          one CSV per table, header = column names

Conversion (:func:`convert_schema`): each ``CREATE TABLE `db`.`t` (...)`` becomes a
sqlite ``CREATE TABLE "t" (...)``: the database qualifier is removed (also in
``REFERENCES``), backtick identifiers become double-quoted ones, column types are kept
as declared (sqlite derives the affinity from the name: ``INT``/``BIGINT`` -> INTEGER,
``VARCHAR``/``CHAR``/``TEXT`` -> TEXT, ``FLOAT``/``DOUBLE``/``REAL`` -> REAL,
``DECIMAL``/``NUMERIC``/``DATE*``/``BOOLEAN`` -> NUMERIC), ``PRIMARY KEY``, ``FOREIGN KEY``
and ``UNIQUE`` are kept, and the MySQL-only pieces are translated with a note:
an inline ``INDEX``/``KEY name (cols)`` becomes a ``CREATE INDEX`` statement,
``AUTO_INCREMENT``/``UNSIGNED``/``COMMENT '...'`` and table options
(``ENGINE=...``, ``DEFAULT CHARSET=...``) are removed. Any other statement, or one
sqlite rejects, raises :class:`SchemaConversionError` quoting the statement.

CSV values: the literal ``NULL`` is SQL NULL; an empty field is NULL in a column with
non-TEXT affinity and the empty string in a TEXT column; everything else is inserted as
text and sqlite's column affinity converts numbers. A row that violates a key is
skipped and counted in the report. A table without a CSV stays empty (reported).

Rows (:func:`make_row`): the verl layout, ``data_source="spider"``,
``reward_model.ground_truth`` the gold SQL, ``extra_info = {db_id, db_path, question,
hardness, split, index}``. The prompt follows the SkyRL-SQL recipe that VerlTool trains
on: one user message with the task overview, the engine, the database schema as its
``CREATE TABLE`` statements, the question, instructions, and the turn format
(``<think>``, ``<sql>`` to run a query, results in ``<observation>``, the final query in
``<solution>``).

    python -m verltool_jax.tasks.spider --spider-dir DIR --out outputs/spider
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import sqlite3
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verltool_jax.data.readers import write_rows
from verltool_jax.rewards.sql_tokens import Token, is_kw, tokenize
from verltool_jax.tasks import EvalReport, TaskFiles
from verltool_jax.tasks.spider_hardness import hardness

DATA_SOURCE = "spider"
OBS_TEMPLATE = "<observation>\n{obs}\n</observation>"
QUERY_FILES = {"test": "test_queries.csv", "train": "train_queries.csv"}


class SchemaConversionError(ValueError):
    """A schema statement could not be converted; the message quotes the statement."""


# ----------------------------------------------------------------------------- schema


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


# ----------------------------------------------------------------------------- load


@dataclass
class DatabaseReport:
    db_id: str
    path: str | None = None
    rows: dict = field(default_factory=dict)  # table -> inserted rows
    skipped_rows: dict = field(default_factory=dict)  # table -> [count, first error]
    missing_csv: list = field(default_factory=list)
    extra_csv: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    error: str | None = None


def _affinity(declared: str) -> str:
    """sqlite's affinity rules (datatype3.html, 3.1) for a declared type."""
    t = (declared or "").upper()
    if "INT" in t:
        return "INTEGER"
    if any(s in t for s in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if not t or "BLOB" in t:
        return "BLOB"
    if any(s in t for s in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def _cell(value: str, affinity: str):
    if value == "NULL":
        return None
    if value == "" and affinity != "TEXT":
        return None
    return value


def _load_csv(conn: sqlite3.Connection, table: str, path: Path, report: DatabaseReport) -> None:
    info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
    by_name = {r[1].lower(): (r[1], _affinity(r[2])) for r in info}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            report.rows[table] = 0
            return
        unknown = [h for h in header if h.lower() not in by_name]
        if unknown:
            raise SchemaConversionError(
                f"{path.name}: columns {unknown} are not in table "
                f"{table!r} (columns {[r[1] for r in info]})"
            )
        cols = [by_name[h.lower()] for h in header]
        sql = (
            f'INSERT INTO "{table}" ('
            + ", ".join('"' + c + '"' for c, _ in cols)
            + ") VALUES ("
            + ", ".join("?" * len(cols))
            + ")"
        )
        rows = [tuple(_cell(v, a) for v, (_, a) in zip(r, cols)) for r in reader if r]
    bad = [r for r in rows if len(r) != len(cols)]
    if bad:
        raise SchemaConversionError(
            f"{path.name}: a row has {len(bad[0])} fields, the header has {len(cols)}"
        )
    try:
        with conn:
            conn.executemany(sql, rows)
        report.rows[table] = len(rows)
    except sqlite3.IntegrityError:
        ok, skipped, first = 0, 0, None
        for r in rows:
            try:
                conn.execute(sql, r)
                ok += 1
            except sqlite3.IntegrityError as e:
                skipped += 1
                first = first or f"{e} (row {r[:4]}...)"
        conn.commit()
        report.rows[table] = ok
        report.skipped_rows[table] = [skipped, first]


def build_database(db_dir: str | os.PathLike, out_path: str | os.PathLike) -> DatabaseReport:
    """Convert ``<db_dir>/schema.sql`` and load ``<db_dir>/data/*.csv`` into a new sqlite
    file ``out_path``. Never raises for a bad database: the report's ``error`` says what
    failed (quoting the statement) and ``path`` is then None."""
    db_dir, out_path = Path(db_dir), Path(out_path)
    report = DatabaseReport(db_dir.name)
    tmp = out_path.with_suffix(".tmp")
    try:
        schema = convert_schema((db_dir / "schema.sql").read_text(encoding="utf-8"))
        report.notes = schema.notes
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        conn = sqlite3.connect(tmp)
        try:
            for stmt in schema.statements:
                try:
                    conn.execute(stmt)
                except sqlite3.Error as e:
                    raise SchemaConversionError(
                        f"sqlite rejected the converted statement ({e}): {stmt}"
                    ) from None
            csvs = {p.stem.lower(): p for p in sorted((db_dir / "data").glob("*.csv"))}
            tables = {t.lower(): t for t in schema.tables}
            for key, table in tables.items():
                if key in csvs:
                    _load_csv(conn, table, csvs[key], report)
                else:
                    report.missing_csv.append(table)
            report.extra_csv = sorted(p.name for k, p in csvs.items() if k not in tables)
            conn.commit()
        finally:
            conn.close()
        os.replace(tmp, out_path)
        report.path = str(out_path)
    except (SchemaConversionError, OSError, ValueError, sqlite3.Error, csv.Error) as e:
        tmp.unlink(missing_ok=True)
        report.error = f"{type(e).__name__}: {e}"
    return report


def schema_text(db_path: str | os.PathLike) -> str:
    """The database's ``CREATE TABLE`` statements as sqlite stores them (what the
    prompt shows), tables in creation order."""
    conn = sqlite3.connect(f"file:{Path(db_path).resolve()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL ORDER BY rowid"
        ).fetchall()
    finally:
        conn.close()
    return "\n\n".join(r[0] + ";" for r in rows)


# ----------------------------------------------------------------------------- queries


@dataclass(frozen=True)
class Query:
    db_id: str
    question: str
    sql: str
    split: str
    index: int


def read_queries(
    spider_dir: str | os.PathLike, splits: Iterable[str] = ("test", "train")
) -> list[Query]:
    """The (database, question, sql) rows of the chosen query files."""
    out = []
    for split in splits:
        if split not in QUERY_FILES:
            raise ValueError(f"unknown split {split!r}; choose from {sorted(QUERY_FILES)}")
        path = Path(spider_dir) / QUERY_FILES[split]
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            need = {"database", "question", "sql"}
            if not need <= set(reader.fieldnames or ()):
                raise ValueError(f"{path}: needs columns {sorted(need)}, has {reader.fieldnames}")
            for i, r in enumerate(reader):
                out.append(Query(r["database"], r["question"], r["sql"], split, i))
    return out


def translate_gold_sql(sql: str, db_id: str) -> str:
    """The gold SQL for the sqlite file: MySQL's database qualifier (```db`.`t``` with
    ``db == db_id``) is removed, everything else is kept byte for byte."""
    toks = tokenize(sql, keep_ws=True)
    out, k = [], 0
    while k < len(toks):
        kind, text = toks[k]
        if (
            kind in ("ident", "word")
            and text.lower() == db_id.lower()
            and k + 2 < len(toks)
            and toks[k + 1] == ("op", ".")
            and toks[k + 2][0] in ("ident", "word")
        ):
            k += 2
            continue
        out.append(f"`{text}`" if kind == "ident" else text)
        k += 1
    return "".join(out)


def tables_read(sql: str, tables: Iterable[str]) -> list[str]:
    """Which of ``tables`` the query names (case-insensitive identifier match)."""
    names = {t.lower(): t for t in tables}
    seen = {text.lower() for kind, text in tokenize(sql) if kind in ("ident", "word")}
    return sorted(names[n] for n in seen & set(names))


def check_gold(
    sql: str, db_path: str | None, empty_tables: Sequence[str] = (), timeout_s: float = 10.0
) -> str | None:
    """None if the gold SQL runs on the database and reads no table left without data,
    else why not."""
    from verltool_jax.rewards.sql_reward import SQLExecutionError, execute_readonly

    if db_path is None:
        return "database not built"
    try:
        execute_readonly(db_path, sql, timeout_s)
    except SQLExecutionError as e:
        return str(e)
    empty = tables_read(sql, empty_tables)
    if empty:
        return f"runs, but reads table(s) {empty} that have no data (CSV missing)"
    return None


# ----------------------------------------------------------------------------- rows


def build_prompt(schema: str, question: str, max_turns: int = 5) -> str:
    """The SkyRL-SQL style user message (structure in the module doc)."""
    return (
        "Task overview:\n"
        "You are an expert in data analysis and SQL. You are given the schema of a "
        "database and a question in natural language. Study the schema and write one SQL "
        "query that answers the question. You have a limited number of turns "
        f"(at most {max_turns}); break the problem down, reason about it, and check your "
        "ideas by running queries.\n\n"
        "Database engine:\nSQLite\n\n"
        f"Database schema:\n{schema}\n"
        "The schema above lists every table with its columns, primary keys and foreign keys.\n\n"
        f"Question:\n{question}\n\n"
        "Instructions:\n"
        "- Return exactly the information the question asks for: if it asks for one "
        "column, select only that column.\n"
        "- The result must contain all the requested information, nothing missing and "
        "nothing extra.\n"
        "- Think about how to build the query before writing the final answer.\n\n"
        "Format:\n"
        "- Reason inside <think>...</think> whenever you get new information.\n"
        "- To run a query against the database, write it inside a single <sql>...</sql> "
        "block; its result (at most 50 rows) or its error comes back inside "
        "<observation>...</observation>.\n"
        "- When no more exploration is needed, or you are out of turns, give the final "
        "SQL query inside <solution>...</solution>.\n"
    )


def make_row(q: Query, db_path: str, schema: str, max_turns: int = 5) -> dict:
    """One verl-layout row for query ``q`` on the sqlite file ``db_path`` (ground truth:
    the gold SQL with the database qualifier removed)."""
    gold = translate_gold_sql(q.sql, q.db_id)
    return {
        "prompt": [{"role": "user", "content": build_prompt(schema, q.question, max_turns)}],
        "data_source": DATA_SOURCE,
        "ability": "sql",
        "reward_model": {"style": "rule", "ground_truth": gold},
        "extra_info": {
            "db_id": q.db_id,
            "db_path": str(db_path),
            "question": q.question,
            "hardness": hardness(gold),
            "split": q.split,
            "index": q.index,
        },
    }


def single_table(sql: str) -> bool:
    """True if the query reads one table and has no subquery or set operation."""
    toks = tokenize(sql)
    selects = sum(1 for t in toks if is_kw(t, "select"))
    return (
        selects == 1
        and not any(is_kw(t, "join", "union", "intersect", "except") for t in toks)
        and not _from_has_comma(toks)
    )


def _from_has_comma(toks: list[Token]) -> bool:
    in_from = False
    for t in toks:
        if is_kw(t, "from"):
            in_from = True
        elif is_kw(t, "where", "group", "order", "limit", "having"):
            in_from = False
        elif in_from and t == ("op", ","):
            return True
    return False


@dataclass
class PrepareReport:
    databases: list[DatabaseReport]
    queries_total: int = 0
    queries_ok: int = 0
    failures: list = field(default_factory=list)  # (split, index, db_id, sql, why)
    rows: dict = field(default_factory=dict)  # split -> number of rows written
    files: dict = field(default_factory=dict)  # split -> path
    row_data: dict = field(default_factory=dict, repr=False)  # split -> rows
    schema_chars: dict = field(default_factory=dict)  # db_id -> length of its prompt schema
    seconds: float = 0.0

    def summary(self) -> str:
        built = [d for d in self.databases if d.path]
        lines = [
            f"databases: {len(built)}/{len(self.databases)} built",
            f"gold queries: {self.queries_ok}/{self.queries_total} run",
        ]
        for d in self.databases:
            if d.error:
                lines.append(f"  FAILED db {d.db_id}: {d.error}")
            if d.missing_csv:
                lines.append(f"  db {d.db_id}: no CSV for table(s) {d.missing_csv} (left empty)")
            for t, (n, why) in d.skipped_rows.items():
                lines.append(f"  db {d.db_id}: {n} row(s) of {t} skipped: {why}")
        for split, idx, db, sql, why in self.failures:
            lines.append(f"  query {split}#{idx} [{db}] fails: {why} | {sql}")
        for split, n in self.rows.items():
            lines.append(f"rows {split}: {n} -> {self.files.get(split)}")
        lines.append(f"time: {self.seconds:.1f}s")
        return "\n".join(lines)


def prepare(
    spider_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    splits: Sequence[str] = ("test", "train"),
    databases: Sequence[str] | None = None,
    only_single_table: bool = False,
    max_turns: int = 5,
    write: bool = True,
) -> PrepareReport:
    """Build the sqlite files under ``<out_dir>/databases``, check every gold query of
    ``splits`` (limited to ``databases`` if given) and write ``<out_dir>/<split>.parquet``
    with one row per query whose gold SQL runs (``only_single_table``: only
    single-table questions)."""
    t0 = time.perf_counter()
    spider_dir, out_dir = Path(spider_dir), Path(out_dir)
    queries = read_queries(spider_dir, splits)
    if databases is not None:
        wanted = set(databases)
        queries = [q for q in queries if q.db_id in wanted]
        db_ids = sorted(wanted)
    else:
        db_ids = sorted({q.db_id for q in queries})
    reports, paths, schemas, empty = [], {}, {}, {}
    for db in db_ids:
        src = spider_dir / "databases" / db
        if not (src / "schema.sql").is_file():
            r = DatabaseReport(db, error=f"no schema.sql under {src}")
        else:
            r = build_database(src, out_dir / "databases" / db / f"{db}.sqlite")
        reports.append(r)
        paths[db] = r.path
        empty[db] = r.missing_csv
        if r.path:
            schemas[db] = schema_text(r.path)
    report = PrepareReport(
        reports,
        queries_total=len(queries),
        schema_chars={db: len(text) for db, text in schemas.items()},
    )
    rows: dict[str, list[dict]] = {s: [] for s in splits}
    for q in queries:
        why = check_gold(
            translate_gold_sql(q.sql, q.db_id), paths.get(q.db_id), empty.get(q.db_id, ())
        )
        if why is not None:
            report.failures.append((q.split, q.index, q.db_id, q.sql, why))
            continue
        report.queries_ok += 1
        if only_single_table and not single_table(q.sql):
            continue
        rows[q.split].append(make_row(q, paths[q.db_id], schemas[q.db_id], max_turns))
    report.row_data = rows
    for split, rs in rows.items():
        report.rows[split] = len(rs)
        if write and rs:
            report.files[split] = str(write_rows(rs, out_dir / f"{split}.parquet"))
    report.seconds = time.perf_counter() - t0
    return report


@dataclass(frozen=True)
class SpiderTask:
    """The ``task`` config section of text-to-SQL on Spider (``configs/vt_sql.py``)."""

    name: str = "spider"
    spider_dir: str = ""  # required: the Spider folder
    databases: tuple[str, ...] = ()  # empty: every database the query files use
    single_table: bool = False  # only single-table questions
    eval_from: str = "test"  # test: Spider dev = eval | pool: mix, hold out
    num_train: int = 0  # 0: all usable train questions
    num_eval: int = 0  # 0: all usable Spider-dev questions
    num_demos: int = 0  # SFT demonstrations (run the gold query); 0: none
    max_schema_chars: int = 0  # only databases whose schema text is this short; 0: any
    seed: int = 0


TASK_CONFIG = SpiderTask


def eval_metrics(trajectories: Sequence[Any], tokenizer: Any = None) -> EvalReport:
    """Execution accuracy overall and by Spider hardness, SQL calls
    (:func:`~verltool_jax.tasks.eval_metrics.sql_eval_metrics`) of scored trajectories
    (each trajectory's reward and ``reward_info``, as ``assign_rewards`` wrote them)."""
    from verltool_jax.rewards.base import RewardResult
    from verltool_jax.tasks.eval_metrics import format_metrics, sql_eval_metrics

    rewards = [
        None
        if t.reward is None
        else RewardResult(t.reward, bool(t.reward_info.get("acc")), dict(t.reward_info))
        for t in trajectories
    ]
    m = sql_eval_metrics(trajectories, rewards)
    title = "text-to-SQL (greedy; execution accuracy by Spider hardness)"
    return EvalReport("sql", title, m, format_metrics(m))


EVAL_METRICS = eval_metrics


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """Prepare Spider from ``config.task.spider_dir`` into ``out_dir``, limited to
    ``config.task.databases`` if non-empty and to single-table questions if
    ``config.task.single_table``. ``eval_from="test"``: train rows from
    ``train_queries.csv``, eval rows from ``test_queries.csv`` (the Spider dev set, on
    other databases); ``"pool"``: both files mixed and shuffled, ``num_eval`` held out.
    ``num_train`` / ``num_eval`` (> 0) subsample with ``config.task.seed``;
    ``num_demos`` > 0 writes that many SFT demonstrations from the train rows
    (:func:`demonstrations`). ``max_schema_chars`` > 0 keeps only questions on databases
    whose schema text (the prompt's ``CREATE TABLE`` statements) is at most that long:
    for models with a short context, or a CPU budget, where prompt length is the cost."""
    t = config.task
    if t.max_schema_chars < 0:
        raise ValueError(
            f"task.max_schema_chars={t.max_schema_chars} must be >= 0 "
            f"(0: databases of any schema size)"
        )
    if not t.spider_dir:
        raise ValueError(
            "task.spider_dir is empty: pass the Spider folder "
            "(test_queries.csv, train_queries.csv, databases/), e.g. "
            "--config.task.spider_dir=/data/spider"
        )
    dbs = tuple(t.databases) or None
    rep = prepare(
        t.spider_dir,
        out_dir,
        ("test", "train"),
        dbs,
        bool(t.single_table),
        config.rollout.max_turns,
        write=False,
    )
    out = Path(out_dir)
    rng = random.Random(t.seed)
    if t.eval_from == "test":
        pools = {"train": rep.row_data.get("train", []), "eval": rep.row_data.get("test", [])}
    elif t.eval_from == "pool":
        rows = rep.row_data.get("test", []) + rep.row_data.get("train", [])
        rng.shuffle(rows)
        n_eval = t.num_eval or len(rows) // 5
        pools = {"eval": rows[:n_eval], "train": rows[n_eval:]}
    else:
        raise ValueError(
            f"task.eval_from must be 'test' (train rows from train_queries.csv, "
            f"eval rows from test_queries.csv) or 'pool' (both files mixed, "
            f"num_eval held out), got {t.eval_from!r}"
        )
    if t.max_schema_chars:
        pools = {
            name: [
                r for r in rows if rep.schema_chars[r["extra_info"]["db_id"]] <= t.max_schema_chars
            ]
            for name, rows in pools.items()
        }
    files = {}
    for name, limit in (("train", t.num_train), ("eval", t.num_eval)):
        rows = pools[name]
        if limit and limit < len(rows):
            rows = rng.sample(rows, limit)
        if not rows:
            raise ValueError(
                f"Spider has no usable {name} question for databases={dbs} "
                f"single_table={bool(t.single_table)} eval_from={t.eval_from!r} "
                f"max_schema_chars={t.max_schema_chars} "
                f"(Spider's train and test databases are disjoint; "
                f"eval_from='pool' splits one set of databases):\n{rep.summary()}"
            )
        files[name] = write_rows(rows, out / f"{name}.parquet")
        pools[name] = rows
    (out / "prepare_report.txt").write_text(rep.summary() + "\n")
    if t.num_demos < 0:
        raise ValueError(f"task.num_demos={t.num_demos} must be >= 0 (0: no demonstrations)")
    sft = demonstrations(config, pools["train"], t.num_demos, t.seed) if t.num_demos else []
    return TaskFiles(
        train=files["train"],
        eval=files["eval"],
        sft=write_rows(sft, out / "sft.parquet") if sft else None,
    )


def solution_after(observation: str, gold: str) -> str | None:
    """``<solution>GOLD</solution>`` once the gold query's result came back; None when
    the tool answered with an error (the query did not run there)."""
    if observation.startswith(("SQL error", "Error")):
        return None
    return f"<solution>{gold}</solution>"


def demonstrations(config, rows: Sequence[dict], num_demos: int, seed: int) -> list[dict]:
    """SFT rows for up to ``num_demos`` training ``rows`` (in an order shuffled by
    ``seed``): run the gold query with the sql tool, read its real result, give the gold
    query as the solution (:mod:`verltool_jax.tasks.demonstrations`)."""
    from verltool_jax.tasks.demonstrations import Proposal, demonstrate

    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    proposals = []
    for i in order:
        gold = rows[i]["reward_model"]["ground_truth"]
        proposals.append(
            Proposal(
                rows[i], f"<sql>{gold}</sql>", lambda obs, gold=gold: solution_after(obs, gold)
            )
        )
    return demonstrate(config, proposals, num_demos)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--spider-dir",
        required=True,
        help="folder with test_queries.csv, "
        "train_queries.csv and databases/<db>/{schema.sql,data/*.csv}",
    )
    ap.add_argument("--out", required=True, help="output folder (sqlite files + parquet)")
    ap.add_argument("--splits", default="test,train")
    ap.add_argument(
        "--databases",
        default="",
        help="comma-separated db ids (default: all that the query files use)",
    )
    ap.add_argument(
        "--single-table", action="store_true", help="rows only for single-table questions"
    )
    ap.add_argument("--json", default="", help="also write the report as JSON here")
    args = ap.parse_args(argv)
    dbs = [d for d in args.databases.split(",") if d] or None
    rep = prepare(
        args.spider_dir, args.out, [s for s in args.splits.split(",") if s], dbs, args.single_table
    )
    print(rep.summary())
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "queries_total": rep.queries_total,
                    "queries_ok": rep.queries_ok,
                    "failures": rep.failures,
                    "rows": rep.rows,
                    "files": rep.files,
                    "databases": [d.__dict__ for d in rep.databases],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
