"""sql tool against real sqlite files through a real server."""

from __future__ import annotations

import sqlite3

import pytest
from support.tool_server import obs_text, one

from tool_server.launcher import run_server
from tool_server.tools.sql import format_table, run_query


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("db") / "shop.db"
    with sqlite3.connect(path) as c:
        c.execute("create table items(id integer primary key, name text, price real)")
        c.executemany(
            "insert into items(name, price) values (?, ?)",
            [(f"item{i}", i * 1.5) for i in range(200)],
        )
    return str(path)


@pytest.fixture(scope="module")
def server():
    with run_server(["sql"], timeout=3, tool_opt={"sql_timeout": 0.5, "sql_max_rows": 10}) as url:
        yield url


def sql(url, query, db):
    obs, done, valid = one(url, "q", f"<sql>{query}</sql>", extra_fields={"db_path": db})
    assert valid and not done
    return obs_text(obs)


def test_format_table():
    t = format_table(["a", "bb"], [(1, "x"), (None, "long\nvalue")], more=False)
    lines = t.splitlines()
    assert lines[0] == "a    | bb"
    assert lines[1] == "-----+------------"
    assert lines[3] == "NULL | long\\nvalue"
    assert lines[-1] == "(2 rows)"
    assert format_table(["a"], [], more=False).endswith("(0 rows)")
    assert "first 1 rows" in format_table(["a"], [(1,)], more=True)
    assert (
        format_table(["c"], [("y" * 50,)], more=False, max_cell_chars=10).splitlines()[2]
        == "yyyyyyy..."
    )


def test_happy_path_table(server, db):
    out = sql(server, "select name, price from items where id <= 2 order by id", db)
    assert out.splitlines()[0].startswith("name")
    assert "item0" in out and "item1" in out and "1.5" in out and "(2 rows)" in out


def test_last_sql_block_is_run(server, db):
    obs, _, _ = one(
        server,
        "q",
        "<sql>select 1</sql> then <sql>select 2 as two</sql>",
        extra_fields={"db_path": db},
    )
    assert obs_text(obs).splitlines()[0] == "two"


def test_row_cap(server, db):
    out = sql(server, "select id from items", db)
    assert "only the first 10 rows" in out
    assert len(out.splitlines()) == 2 + 10 + 1


def test_writes_do_not_survive(server, db):
    for q in [
        "delete from items",
        "insert into items(name, price) values ('x', 1)",
        "drop table items",
        "create table z(a)",
        "update items set price = 0",
    ]:
        out = sql(server, q, db)
        assert out.startswith("SQL error") and "readonly" in out, (q, out)
    assert sql(server, "select count(*) as n from items", db).splitlines()[2].strip() == "200"


def test_attach_is_refused(server, db, tmp_path):
    out = sql(server, f"attach database '{tmp_path / 'new.db'}' as x", db)
    assert "SQL error" in out and "not authorized" in out
    assert not (tmp_path / "new.db").exists()


def test_sql_errors_missing_db_and_missing_field(server, db, tmp_path):
    assert "no such table: nope" in sql(server, "select * from nope", db)
    assert "syntax error" in sql(server, "selec 1", db)
    assert "not found: missing.db" in sql(server, "select 1", str(tmp_path / "missing.db"))
    obs, _, valid = one(server, "q", "<sql>select 1</sql>")
    assert valid and 'extra_field["db_path"]' in obs_text(obs)
    assert "only execute one statement" in sql(server, "select 1; select 2", db)


def test_timeout_is_an_observation(server, db):
    q = "with recursive c(x) as (select 1 union all select x + 1 from c) select count(*) from c"
    out = sql(server, q, db)
    assert "longer than 0.5 s" in out
    assert "200" in sql(server, "select count(*) from items", db)


def test_run_query_direct(db):
    cols, rows, more = run_query(db, "select id from items order by id", 1.0, 3)
    assert cols == ["id"] and rows == [(1,), (2,), (3,)] and more
    with pytest.raises(sqlite3.OperationalError):
        run_query(db, "delete from items", 1.0, 3)
