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

Modules: :mod:`.schema` (MySQL DDL -> sqlite), :mod:`.database` (sqlite file from a
schema and its CSVs), :mod:`.rows` (queries, gold check, prompt, rows), :mod:`.task`
(the task section, preparation from a run config, metrics, demonstrations, CLI).
"""

from verltool_jax.tasks.spider.database import DatabaseReport, build_database, schema_text
from verltool_jax.tasks.spider.rows import (
    DATA_SOURCE,
    QUERY_FILES,
    PrepareReport,
    Query,
    build_prompt,
    check_gold,
    make_row,
    prepare,
    read_queries,
    single_table,
    tables_read,
    translate_gold_sql,
)
from verltool_jax.tasks.spider.schema import ConvertedSchema, SchemaConversionError, convert_schema
from verltool_jax.tasks.spider.task import (
    EVAL_METRICS,
    OBS_TEMPLATE,
    TASK_CONFIG,
    SpiderTask,
    demonstrations,
    eval_metrics,
    main,
    solution_after,
    write_task_from_config,
)

__all__ = [
    "DATA_SOURCE",
    "EVAL_METRICS",
    "OBS_TEMPLATE",
    "QUERY_FILES",
    "TASK_CONFIG",
    "ConvertedSchema",
    "DatabaseReport",
    "PrepareReport",
    "Query",
    "SchemaConversionError",
    "SpiderTask",
    "build_database",
    "build_prompt",
    "check_gold",
    "convert_schema",
    "demonstrations",
    "eval_metrics",
    "main",
    "make_row",
    "prepare",
    "read_queries",
    "schema_text",
    "single_table",
    "solution_after",
    "tables_read",
    "translate_gold_sql",
    "write_task_from_config",
]
