"""Spider's query files, the gold-query check, the SkyRL-SQL prompt and the verl rows
(:func:`prepare`: databases, checked queries and rows in one pass)."""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verltool_jax.data.readers import write_rows
from verltool_jax.rewards.sql_tokens import Token, is_kw, tokenize
from verltool_jax.tasks.spider.database import DatabaseReport, build_database, schema_text
from verltool_jax.tasks.spider_hardness import hardness

DATA_SOURCE = "spider"
QUERY_FILES = {"test": "test_queries.csv", "train": "train_queries.csv"}


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
