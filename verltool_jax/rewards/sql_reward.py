"""Text-to-SQL: execution match of the predicted and the gold SQL on the row's database.

Both queries run read-only (``sqlite3`` URI ``mode=ro``; only SELECT/WITH statements)
with a time limit; the reward is 1 if their result sets are equal: as multisets of
rows, or as ordered lists when the gold query has ``ORDER BY`` at its outermost level
(as Spider's evaluation does; an ORDER BY inside a subquery does not order the result).
Values compare after rounding floats to 6 places.

Two rewards: ``sql`` (lenient: the final SQL is the last ``<solution>``/``<answer>``/
```` ```sql ```` block, else the last ``<sql>`` action; no answer scores 0 with
``has_answer=False`` so ``reward.format_penalty`` applies) and ``sql_solution`` (the
SkyRL-SQL rule VerlTool trains with: -1 if the model's text has no non-empty
``<solution>...</solution>``, else execution match 1/0). The database path is ``extra_info["db_path"]`` (or
``ground_truth["db_path"]`` with the gold SQL in ``ground_truth["sql"]``).
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tool_server.kit.tags import last_tag_body
from verltool_jax.rewards.base import RewardResult, register_reward
from verltool_jax.rewards.sql_tokens import top_level_order_by

_FENCE_RE = re.compile(r"```sql\s*(.*?)```", re.DOTALL | re.IGNORECASE)


class SQLExecutionError(RuntimeError):
    """A query failed, timed out, or is not a read-only query."""


def extract_sql(text: str) -> str | None:
    """The final SQL: the last ``<solution>``, ``<answer>`` or ```` ```sql ```` block,
    else the last ``<sql>`` action."""
    for tag in ("solution", "answer"):
        body = last_tag_body(text or "", tag)
        if body:
            fenced = _FENCE_RE.findall(body)
            return fenced[-1].strip() if fenced else body
    fenced = _FENCE_RE.findall(text or "")
    if fenced:
        return fenced[-1].strip()
    return last_tag_body(text or "", "sql")


def execute_readonly(db_path: str | Path, sql: str, timeout_s: float = 5.0) -> list[tuple]:
    """All rows of ``sql`` on a read-only connection, aborted after ``timeout_s``."""
    stmt = sql.strip().rstrip(";").strip()
    if not re.match(r"(?is)^\s*(select|with)\b", stmt) or ";" in stmt:
        raise SQLExecutionError("only a single SELECT/WITH query is allowed")
    path = Path(db_path)
    if not path.is_file():
        raise SQLExecutionError(f"database {str(path)!r} does not exist")
    conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    try:
        return [tuple(r) for r in conn.execute(stmt).fetchall()]
    except sqlite3.OperationalError as e:
        if "interrupted" in str(e):
            raise SQLExecutionError(f"query timed out after {timeout_s}s") from None
        raise SQLExecutionError(f"query failed: {e}") from None
    except sqlite3.Error as e:
        raise SQLExecutionError(f"query failed: {e}") from None
    finally:
        conn.close()


def _canon(row: tuple) -> tuple:
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


def result_sets_match(pred: list[tuple], gold: list[tuple], ordered: bool = False) -> bool:
    """Equal as ordered lists (``ordered``) or as multisets of rows."""
    p, g = [_canon(r) for r in pred], [_canon(r) for r in gold]
    return p == g if ordered else Counter(p) == Counter(g)


def _gold_and_db(ground_truth: Any, extra_info: dict) -> tuple[str, str]:
    if isinstance(ground_truth, dict):
        gold, db = ground_truth.get("sql"), ground_truth.get("db_path", extra_info.get("db_path"))
    else:
        gold, db = ground_truth, extra_info.get("db_path")
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(
            "SQL reward: reward_model.ground_truth must be the gold SQL string "
            "(or a dict with 'sql')"
        )
    if not db:
        raise ValueError(
            "SQL reward: the row needs extra_info.db_path (the sqlite file to run both queries on)"
        )
    return gold, str(db)


def execution_match(pred_sql: str, gold_sql: str, db: str, timeout_s: float = 5.0) -> RewardResult:
    """1.0 if ``pred_sql``'s result equals ``gold_sql``'s on ``db`` (ordered only when the
    gold query orders at its outermost level), else 0.0; a failing prediction scores 0
    with ``info["exec_error"]``. A failing gold query raises (the data is broken)."""
    gold_rows = execute_readonly(db, gold_sql, timeout_s)
    try:
        pred_rows = execute_readonly(db, pred_sql, timeout_s)
    except SQLExecutionError as e:
        return RewardResult(
            0.0, False, {"pred": pred_sql, "has_answer": True, "exec_error": str(e)}
        )
    ok = result_sets_match(pred_rows, gold_rows, top_level_order_by(gold_sql))
    return RewardResult(float(ok), ok, {"pred": pred_sql, "has_answer": True})


@register_reward("sql", "spider", "bird", "synsql", "text2sql")
def sql_reward(
    response_text: str, ground_truth: Any, extra_info: dict, timeout_s: float = 5.0
) -> RewardResult:
    """1.0 if the predicted SQL's result set equals the gold SQL's, else 0.0."""
    gold_sql, db = _gold_and_db(ground_truth, extra_info or {})
    pred_sql = extract_sql(response_text)
    if not pred_sql:
        return RewardResult(0.0, False, {"pred": None, "has_answer": False})
    return execution_match(pred_sql, gold_sql, db, timeout_s)


FORMAT_ERROR_SCORE = -1.0


def solution_sql(text: str) -> str | None:
    """The body of the last ``<solution>`` block (its last ```` ```sql ```` fence if it
    has one), or None when there is no non-empty one."""
    body = last_tag_body(text or "", "solution")
    if not body or not body.strip():
        return None
    fenced = _FENCE_RE.findall(body)
    sql = fenced[-1].strip() if fenced else body.strip()
    return sql or None


@register_reward("sql_solution")
def sql_solution_reward(
    response_text: str, ground_truth: Any, extra_info: dict, timeout_s: float = 5.0
) -> RewardResult:
    """SkyRL-SQL's reward: ``FORMAT_ERROR_SCORE`` (-1) without a ``<solution>``, else
    execution match 1/0 (:func:`execution_match`). The -1 is the reward's own, so leave
    ``reward.format_penalty`` at 0 with it."""
    gold_sql, db = _gold_and_db(ground_truth, extra_info or {})
    pred_sql = solution_sql(response_text)
    if pred_sql is None:
        return RewardResult(
            FORMAT_ERROR_SCORE, False, {"pred": None, "has_answer": False, "format_error": True}
        )
    return execution_match(pred_sql, gold_sql, db, timeout_s)
