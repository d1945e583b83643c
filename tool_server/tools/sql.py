"""``sql``: run the model's SQL against a read-only sqlite database.

Action: the last ``<sql>...</sql>`` block of the turn (one statement). The database is
the file named by ``extra_field["db_path"]``, opened read-only (``mode=ro``, plus
``PRAGMA query_only``; ``ATTACH`` is refused), so no write survives. A query runs for at
most ``sql_timeout`` seconds (a progress handler interrupts it) and returns at most
``sql_max_rows`` rows (and ``sql_max_result_bytes``) as a plain-text table. SQL errors, a missing database and
timeouts are observations, never exceptions.

Under ``--compat verltool`` (or ``--tool-opt sql_compat=verltool``) parsing and
observation follow VerlTool's sql tool (``tool_server/kit/sql_compat.py``); the
database is opened read-only all the same.

Options (``--tool-opt``): ``sql_timeout`` (s, default min(5, server timeout - 0.5)),
``sql_max_rows`` (50), ``sql_max_cell_chars`` (100), ``sql_max_value_bytes`` (1 MiB: the
longest string or blob a query may build), ``sql_max_result_bytes`` (1 MiB: rows fetched
stop there), ``sql_db_root`` (if set, db_path must lie under it).
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from tool_server.kit import sql_compat as vt
from tool_server.kit.base import BaseTool, Observation
from tool_server.kit.options import tool_option
from tool_server.kit.tags import last_tag_body

_DENIED = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH}


def _cell(value: Any, max_chars: int) -> str:
    if value is None:
        s = "NULL"
    elif isinstance(value, bytes):
        s = f"<{len(value)} bytes>"
    elif isinstance(value, float):
        s = repr(value)
    else:
        s = str(value)
    s = s.replace("\n", "\\n")
    return s if len(s) <= max_chars else s[: max_chars - 3] + "..."


def format_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], more: bool, max_cell_chars: int = 100
) -> str:
    """A readable text table: header, separator, one line per row, columns padded to
    their widest cell (cells cut to ``max_cell_chars``); ``more`` appends a note that
    rows were cut."""
    if not columns:
        return "Query executed successfully (no result set)."
    head = [_cell(c, max_cell_chars) for c in columns]
    body = [[_cell(v, max_cell_chars) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(head), "-+-".join("-" * w for w in widths)]
    out += [line(r) for r in body]
    if not body:
        out.append("(0 rows)")
    elif more:
        out.append(f"... (only the first {len(body)} rows are shown)")
    else:
        out.append(f"({len(body)} row{'s' if len(body) != 1 else ''})")
    return "\n".join(out)


def _authorizer(action: int, *args: Any) -> int:
    return sqlite3.SQLITE_DENY if action in _DENIED else sqlite3.SQLITE_OK


def value_bytes(value: Any) -> int:
    """Approximate bytes a fetched value holds: its length for text and blobs, 8 else."""
    return len(value) if isinstance(value, (str, bytes)) else 8


def run_query(
    db_path: str,
    query: str,
    timeout_s: float,
    max_rows: int,
    max_value_bytes: int = 1 << 20,
    max_result_bytes: int = 1 << 20,
    lenient_text: bool = False,
    in_transaction: bool = False,
) -> tuple[list[str], list[tuple], bool]:
    """Run ``query`` on the database read-only -> ``(columns, rows, more_rows_exist)``.

    Bounded in rows and in bytes: no string or blob may exceed ``max_value_bytes``
    (sqlite's ``SQLITE_LIMIT_LENGTH``, so ``zeroblob(400000000)`` fails inside sqlite
    with "string or blob too big" instead of being built), and rows stop once their values
    (:func:`value_bytes`) add up to ``max_result_bytes`` (``more_rows_exist`` is then True).
    ``lenient_text``: text that is not UTF-8 loses its bad bytes instead of raising;
    ``in_transaction``: the query runs inside ``BEGIN`` (both as VerlTool's executor).
    Raises ``sqlite3.Error`` (``OperationalError('interrupted')`` on timeout)."""
    uri = "file:" + urllib.parse.quote(os.path.abspath(db_path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=min(timeout_s, 1.0), check_same_thread=False)
    try:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
        conn.execute("PRAGMA query_only = ON")
        conn.set_authorizer(_authorizer)
        if lenient_text:
            conn.text_factory = lambda b: b.decode(errors="ignore")
        if in_transaction:
            conn.execute("BEGIN TRANSACTION;")
        deadline = time.monotonic() + timeout_s
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
        cur = conn.execute(query)
        columns = [d[0] for d in cur.description] if cur.description else []
        rows: list[tuple] = []
        more = False
        used = 0
        while columns:
            row = cur.fetchone()
            if row is None:
                break
            if len(rows) == max_rows:
                more = True
                break
            used += sum(value_bytes(v) for v in row)
            if used > max_result_bytes and rows:
                more = True
                break
            rows.append(row)
        return columns, rows, more
    finally:
        conn.close()


class SqlTool(BaseTool):
    name = "sql"
    call_tag = "sql"
    call_arg = "query"
    usage = (
        "Query the task's sqlite database: write one SQL statement inside "
        "<sql>...</sql>. The database is read-only; up to 50 rows are shown."
    )
    verltool_usage = (
        "You can execute SQL queries using <sql>...</sql> tags for intermediate "
        "verification or <solution>...</solution> tags for final answers."
    )

    def __init__(self, settings=None) -> None:
        super().__init__(settings)
        extra = self.settings.extra
        self.timeout_s = tool_option(
            extra,
            "sql_timeout",
            float,
            max(0.1, min(5.0, self.settings.timeout_s - 0.5)),
            minimum=0.01,
        )
        self.max_rows = tool_option(extra, "sql_max_rows", int, 50, minimum=1)
        self.max_cell_chars = tool_option(extra, "sql_max_cell_chars", int, 100, minimum=8)
        self.max_value_bytes = tool_option(extra, "sql_max_value_bytes", int, 1 << 20, minimum=1024)
        self.max_result_bytes = tool_option(
            extra, "sql_max_result_bytes", int, 1 << 20, minimum=1024
        )
        root = tool_option(extra, "sql_db_root", str, None)
        self.db_root: str | None = os.path.realpath(root) if root else None

    def parse_action(self, action: str) -> tuple[Any, bool]:
        body = vt.parse_sql_action(action) if self.verltool_compat else last_tag_body(action, "sql")
        return (body, True) if body is not None else (None, False)

    def _db_path(self, extra_field: dict) -> tuple[str | None, str | None]:
        path = (extra_field or {}).get("db_path")
        if not path or not isinstance(path, str):
            return None, (
                "Error: no database for this task: the request must set "
                'extra_field["db_path"] to the sqlite file.'
            )
        real = os.path.realpath(path)
        refused = self._root_refusal(path)
        if refused:
            return None, refused
        if not os.path.isfile(real):
            return None, f"Error: database file not found: {os.path.basename(path)}"
        return real, None

    def _root_refusal(self, path: str) -> str | None:
        if self.db_root and not os.path.realpath(path).startswith(self.db_root + os.sep):
            return f"Error: database {path!r} is outside the allowed root."
        return None

    def _verltool_rows(self, path: str, query: str) -> list:
        _, rows, _ = run_query(
            path, query, self.timeout_s, vt.MAX_FETCH_ROWS, lenient_text=True, in_transaction=True
        )
        return rows

    def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        if self.verltool_compat:
            obs, valid = vt.observation(
                parsed, extra_field, self._verltool_rows, self._root_refusal
            )
            return obs, False, valid
        query = parsed.strip()
        if not query:
            return "Error: the <sql> block is empty.", False, True
        path, error = self._db_path(extra_field)
        if error:
            return error, False, True
        assert path is not None  # _db_path gives a path or an error
        try:
            columns, rows, more = run_query(
                path,
                query,
                self.timeout_s,
                self.max_rows,
                self.max_value_bytes,
                self.max_result_bytes,
            )
        except sqlite3.OperationalError as e:
            if str(e) == "interrupted":
                return (
                    f"Error: the query ran longer than {self.timeout_s:g} s and was stopped.",
                    False,
                    True,
                )
            return f"SQL error: {e}", False, True
        except (sqlite3.Error, sqlite3.Warning, ValueError) as e:
            return f"SQL error: {e}", False, True
        return format_table(columns, rows, more, self.max_cell_chars), False, True
