"""Build one Spider database as a sqlite file from its ``schema.sql`` and CSVs
(:func:`build_database`), and the prompt's schema text (:func:`schema_text`)."""

from __future__ import annotations

import csv
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from verltool_jax.tasks.spider.schema import SchemaConversionError, convert_schema


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
