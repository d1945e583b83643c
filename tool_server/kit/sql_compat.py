"""``sql`` under ``--compat verltool``: VerlTool's parsing and observation (not a tool:
``_`` files are skipped).

Follows VerlTool's ``verl_tool/servers/tools/sql.py`` and its
``utils/sql_executor.sql_observation``:

* action: the text between the LAST ``<sql>`` and the first ``</sql>`` after it,
  stripped (no such pair: not an sql action);
* query: inside that text, the last ```` ```sql ```` block, else the last ``<sql>``, else
  the last ``<solution>`` body (stripped), else the text itself; then ``"> ="``, ``"< ="``,
  ``"! ="`` become ``">="``, ``"<="``, ``"!="`` and ``YEAR(CURDATE())`` becomes ``2020``
  before running;
* result text: an empty query, a missing database, an error (``"Error executing SQL:
  {error}"``; an error whose text contains "timeout", or an interrupted query, gives
  ``"SQL Timeout:\\n{query}"``), else the rows as ``pandas.DataFrame(rows).to_string(
  index=False)``, or, over :data:`MAX_RESULT_CHARS`, ``TRUNCATED_PREFIX`` + the first
  :data:`TRUNCATED_ROWS` rows so formatted;
* observation: ``{"obs": "\\n\\n<observation>{text}\\n<reminder>You have {turns_left}
  turns left to complete the task.</reminder></observation>\\n\\n", "parsed_sql":
  action text}`` with done=False, valid=True (``turns_left`` from ``extra_field``,
  default 0). No ``db_path`` and no ``db_id`` gives ``"Execution Error:\\n'db_id'"``
  with valid=False.

The database is still opened read-only by :func:`tool_server.tools.sql.run_query`
(``ATTACH`` refused), so a write or an attach fails with sqlite's error message.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

SQL_OPEN, SQL_CLOSE = "<sql>", "</sql>"
INVALID_TEXT = (
    "Your previous action is invalid. Follow the format of outputting thinking "
    "process and sql tool, and try again."
)
REMINDER = "<reminder>You have {turns_left} turns left to complete the task.</reminder>"
MAX_RESULT_CHARS = 9000
TRUNCATED_ROWS = 50
TRUNCATED_PREFIX = "Truncated to 50 lines since returned response too long: "
# Rows fetched at most: beyond this many the full table text is surely over
# MAX_RESULT_CHARS (each row is at least one character and a newline), so the answer is
# the truncated form either way.
MAX_FETCH_ROWS = MAX_RESULT_CHARS + 1
CACHE_DIR_ENV, DEFAULT_CACHE_DIR = "SQL_CACHE_DIR", "data/nl2sql/cache"

_MARKDOWN_SQL = re.compile(r"```sql[ \t]*[\r\n]+(.*?)[\r\n]+[ \t]*```", re.DOTALL | re.IGNORECASE)
_TAGGED = tuple(
    re.compile(rf"<{t}>(.*?)</{t}>", re.DOTALL | re.IGNORECASE) for t in ("sql", "solution")
)
_CURDATE_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)", re.IGNORECASE)


def parse_sql_action(action: str) -> str | None:
    """The stripped text between the last ``<sql>`` and the next ``</sql>``, or None."""
    start = action.rfind(SQL_OPEN)
    if start == -1:
        return None
    end = action.find(SQL_CLOSE, start + len(SQL_OPEN))
    if end == -1:
        return None
    return action[start + len(SQL_OPEN) : end].strip()


def _fix_operators(query: str) -> str:
    return query.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")


def extract_query(text: str) -> str:
    """The query inside the action text (module docstring), operators fixed."""
    for pattern in (_MARKDOWN_SQL, *_TAGGED):
        matches = pattern.findall(text)
        if matches:
            return _fix_operators(matches[-1].strip())
    return _fix_operators(text)


def replace_current_year(query: str) -> str:
    """``YEAR(CURDATE())`` (any case and spacing) -> ``2020``."""
    return _CURDATE_YEAR.sub("2020", query)


def format_rows(rows: Sequence[Sequence[Any]]) -> str:
    """The rows as pandas prints them without the index, cut to the first
    :data:`TRUNCATED_ROWS` (with :data:`TRUNCATED_PREFIX`) when too long."""
    import pandas as pd

    df = pd.DataFrame(list(rows))
    text = df.to_string(index=False)
    if len(text) > MAX_RESULT_CHARS:
        return TRUNCATED_PREFIX + df.head(TRUNCATED_ROWS).to_string(index=False)
    return text


def db_path_for(extra_field: dict) -> str:
    """``extra_field["db_path"]``, else ``$SQL_CACHE_DIR/<db_id>`` (KeyError without both)."""
    path = extra_field.get("db_path")
    if path:
        return path
    return os.path.join(os.getenv(CACHE_DIR_ENV, DEFAULT_CACHE_DIR), extra_field["db_id"])


def result_text(
    parsed: str,
    extra_field: dict,
    run: Callable[[str, str], list],
    check_path: Callable[[str], str | None],
) -> str:
    """The text inside ``<observation>`` for the action text ``parsed``.

    ``run(db_path, query) -> rows`` runs the query (raising on error);
    ``check_path(db_path)`` returns an error text for a path the server refuses, else None.
    Raises KeyError when the request names no database at all.
    """
    path = db_path_for(extra_field)
    query = extract_query(parsed)
    if not query:
        return INVALID_TEXT
    refused = check_path(path)  # before the existence test: nothing is told about
    if refused:  # paths outside the allowed root
        return refused
    if not os.path.exists(path):
        return f"The database file {path} does not exist."
    try:
        rows = run(path, replace_current_year(query))
    except Exception as e:  # every error becomes its text, as VerlTool's executor does
        interrupted = isinstance(e, sqlite3.OperationalError) and "interrupted" in str(e)
        error = "SQL Timeout" if interrupted else f"Error executing SQL: {e}"
        return f"SQL Timeout:\n{query}" if "timeout" in error.lower() else error
    return format_rows(rows)


def observation(parsed: str, extra_field: dict | None, run, check_path) -> tuple[dict, bool]:
    """``({"obs": ..., "parsed_sql": parsed}, valid)`` (module docstring)."""
    extra_field = extra_field or {}
    valid = True
    try:
        text = result_text(parsed, extra_field, run, check_path)
    except Exception as e:
        text, valid = f"Execution Error:\n{e}", False
    reminder = REMINDER.format(turns_left=extra_field.get("turns_left", 0))
    return {
        "obs": f"\n\n<observation>{text}\n{reminder}</observation>\n\n",
        "parsed_sql": parsed,
    }, valid
