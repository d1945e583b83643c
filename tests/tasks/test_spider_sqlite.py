"""Spider MySQL dump -> sqlite: schema translation, CSV loading (NULLs, quoting), the
gold-query check on real databases, the rows, and Spider's hardness levels."""

import sqlite3
from pathlib import Path

import pytest

from verltool_jax.data.readers import read_rows
from verltool_jax.rewards.sql_tokens import tokenize, top_level_order_by
from verltool_jax.tasks import spider
from verltool_jax.tasks.spider_hardness import hardness, hardness_counts

SPIDER = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "spider"
needs_spider = pytest.mark.skipif(
    not (SPIDER / "test_queries.csv").is_file(), reason=f"Spider data not found at {SPIDER}"
)

SCHEMA = """-- Dialect: mysql | Database: shop | Table Count: 2

CREATE TABLE `shop`.`maker` (
    `id` INT(11) NOT NULL AUTO_INCREMENT COMMENT 'the key',
    `name` VARCHAR(20) NOT NULL DEFAULT '',
    `country` CHAR(3) DEFAULT NULL,
    PRIMARY KEY (`id`),
    UNIQUE (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8;

CREATE TABLE `shop`.`item` (
    `item_id` INTEGER NOT NULL,
    `maker_id` INT,
    `price` FLOAT(10,2) DEFAULT '0.00',
    `it's` TEXT,
    `added` DATETIME DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (`item_id`),
    FOREIGN KEY (`maker_id`) REFERENCES `shop`.`maker` (`id`),
    INDEX idx_maker (`maker_id`)
);
"""


def make_db_dir(tmp_path, schema=SCHEMA, csvs=None):
    d = tmp_path / "shop"
    (d / "data").mkdir(parents=True)
    (d / "schema.sql").write_text(schema)
    for name, text in (csvs or {}).items():
        (d / "data" / name).write_text(text)
    return d


def test_convert_schema_translates_mysql_with_notes():
    conv = spider.convert_schema(SCHEMA)
    assert list(conv.tables) == ["maker", "item"]
    assert conv.tables["item"] == ["item_id", "maker_id", "price", "it's", "added"]
    text = "\n".join(conv.statements)
    assert "`" not in text and "shop" not in text and "AUTO_INCREMENT" not in text
    assert 'REFERENCES "maker" ("id")' in text
    assert any(
        s.startswith('CREATE INDEX "item_idx_maker" ON "item" ("maker_id")')
        for s in conv.statements
    )
    notes = "\n".join(conv.notes)
    for expected in ("AUTO_INCREMENT", "COMMENT", "ENGINE", "CREATE INDEX"):
        assert expected in notes
    conn = sqlite3.connect(":memory:")
    for s in conv.statements:
        conn.execute(s)
    info = {r[1]: (r[2], r[3], r[5]) for r in conn.execute('PRAGMA table_info("maker")')}
    assert info["id"] == ("INT(11)", 1, 1) and info["country"][0] == "CHAR(3)"


def test_unconvertible_statement_is_reported_with_the_statement(tmp_path):
    with pytest.raises(spider.SchemaConversionError, match="CREATE VIEW"):
        spider.convert_schema(SCHEMA + "\nCREATE VIEW v AS SELECT 1;")
    d = make_db_dir(
        tmp_path, SCHEMA + "\nCREATE TRIGGER t BEFORE INSERT ON item FOR EACH ROW SET x = 1;"
    )
    rep = spider.build_database(d, tmp_path / "out" / "shop.sqlite")
    assert rep.path is None and "CREATE TRIGGER" in rep.error
    assert not (tmp_path / "out" / "shop.sqlite").exists()


def test_csv_nulls_quoting_types_and_key_violations(tmp_path):
    d = make_db_dir(
        tmp_path,
        csvs={
            "maker.csv": 'id,name,country\n1,"Acme, Inc.",USA\n2,"Say ""hi""",NULL\n3,,\n3,dup,X\n',
            "item.csv": "item_id,maker_id,price,it's,added\n10,1,2.50,NULL,2020-01-01\n"
            "11,,3,,NULL\n",
        },
    )
    rep = spider.build_database(d, tmp_path / "shop.sqlite")
    assert rep.error is None, rep.error
    assert rep.rows == {"maker": 3, "item": 2}
    assert rep.skipped_rows["maker"][0] == 1 and "UNIQUE" in rep.skipped_rows["maker"][1]
    conn = sqlite3.connect(rep.path)
    makers = conn.execute("SELECT id, name, country FROM maker ORDER BY id").fetchall()
    assert makers == [(1, "Acme, Inc.", "USA"), (2, 'Say "hi"', None), (3, "", "")]
    items = conn.execute(
        'SELECT item_id, maker_id, price, "it\'s", added FROM item ORDER BY item_id'
    ).fetchall()
    # NULL literal -> NULL; empty numeric -> NULL; empty text -> ''; numbers typed by affinity
    assert items == [(10, 1, 2.5, None, "2020-01-01"), (11, None, 3.0, "", None)]
    assert "CREATE TABLE" in spider.schema_text(rep.path)


def test_missing_csv_reported_and_queries_reading_it_flagged(tmp_path):
    d = make_db_dir(tmp_path, csvs={"maker.csv": "id,name,country\n1,a,b\n"})
    rep = spider.build_database(d, tmp_path / "shop.sqlite")
    assert rep.missing_csv == ["item"]
    why = spider.check_gold("SELECT count(*) FROM `item`", rep.path, rep.missing_csv)
    assert why and "no data" in why
    assert spider.check_gold("SELECT name FROM maker", rep.path, rep.missing_csv) is None
    assert "no such column" in spider.check_gold("SELECT nme FROM maker", rep.path)


def test_translate_gold_sql_removes_only_the_db_qualifier():
    sql = "SELECT `c`.`x`, 'shop.t' FROM `shop`.`Things` AS `c` WHERE shop.Things.y = 1"
    assert spider.translate_gold_sql(sql, "shop") == (
        "SELECT `c`.`x`, 'shop.t' FROM `Things` AS `c` WHERE Things.y = 1"
    )


# Spider dev questions (concert_singer, car_1) with the levels Spider's evaluation script
# gives them, then made-up queries labelled by hand from the rules in the module doc.
HAND_LABELLED = [
    ("SELECT count(*) FROM singer", "easy"),
    ("SELECT name, country, age FROM singer ORDER BY age DESC", "medium"),
    ("SELECT avg(age), min(age), max(age) FROM singer WHERE country = 'France'", "medium"),
    (
        "SELECT T2.name, count(*) FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = "
        "T2.stadium_id GROUP BY T1.stadium_id",
        "medium",
    ),
    ("SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert)", "hard"),
    (
        "SELECT country FROM singer WHERE age > 40 INTERSECT SELECT country FROM singer "
        "WHERE age < 30",
        "hard",
    ),
    (
        "SELECT T2.name, T2.capacity FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = "
        "T2.stadium_id WHERE T1.year >= 2014 GROUP BY T2.stadium_id ORDER BY count(*) DESC "
        "LIMIT 1",
        "extra",
    ),
    ("SELECT song_name FROM singer WHERE age > (SELECT avg(age) FROM singer)", "hard"),
    ("SELECT count(*) FROM cars_data WHERE cylinders > 4", "easy"),
    # c1 = where + or + 2 like = 4 -> extra
    ("SELECT name FROM people WHERE name LIKE '%a%' OR name LIKE '%e%'", "extra"),
    (
        "SELECT T1.name FROM a AS T1 JOIN b AS T2 ON T1.id = T2.id WHERE T2.x BETWEEN 1 AND 5 "
        "AND T2.y = 3",
        "medium",
    ),
    # HAVING is not in c1; its aggregates are not counted, its AND is (one): easy
    ("SELECT name FROM t GROUP BY name HAVING count(*) > 1 AND max(x) < 3", "easy"),
    ("SELECT name, count(*) FROM t GROUP BY name HAVING count(*) > 1 AND max(x) < 3", "medium"),
]


@pytest.mark.parametrize("sql,level", HAND_LABELLED)
def test_hardness_hand_labelled(sql, level):
    assert hardness(sql) == level, hardness_counts(sql)


def test_hardness_counts_details():
    c = hardness_counts("SELECT a FROM t WHERE x = 1 AND y BETWEEN 2 AND 3 OR z LIKE 'q'")
    assert (c.component1, c.component2, c.others) == (3, 0, 1)  # where + or + like
    c = hardness_counts("SELECT a FROM t WHERE a IN (SELECT b FROM u) UNION SELECT c FROM v")
    assert c.component2 == 2


def test_tokenizer_and_top_level_order():
    assert tokenize("SELECT `a b`, 'it''s' -- c\nFROM t") == [
        ("word", "SELECT"),
        ("ident", "a b"),
        ("op", ","),
        ("str", "'it''s'"),
        ("word", "FROM"),
        ("word", "t"),
    ]
    with pytest.raises(ValueError, match="unterminated"):
        tokenize("SELECT 'x")
    assert top_level_order_by("SELECT a FROM t ORDER BY a")
    assert not top_level_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 3)")
    assert not top_level_order_by("SELECT 'order by' FROM t")


@needs_spider
def test_real_databases_gold_queries_and_rows(tmp_path):
    rep = spider.prepare(
        SPIDER, tmp_path, splits=("test",), databases=("concert_singer", "pets_1", "wta_1")
    )
    by_db = {d.db_id: d for d in rep.databases}
    assert all(d.path for d in rep.databases), rep.summary()
    assert by_db["wta_1"].missing_csv == ["rankings"]
    assert by_db["concert_singer"].rows == {
        "stadium": 9,
        "singer": 6,
        "concert": 6,
        "singer_in_concert": 10,
    }
    # every gold query runs; the only rejected ones read wta_1's table without data
    assert rep.queries_total == 45 + 42 + 62
    assert {f[2] for f in rep.failures} == {"wta_1"}
    assert all("rankings" in f[4] for f in rep.failures) and len(rep.failures) == 8
    assert rep.queries_ok == rep.queries_total - 8
    rows = read_rows(rep.files["test"])
    assert len(rows) == rep.queries_ok
    r = rows[0]
    assert r["data_source"] == "spider" and r["extra_info"]["hardness"] in spider_levels()
    assert Path(r["extra_info"]["db_path"]).is_file()
    prompt = r["prompt"][0]["content"]
    assert 'CREATE TABLE "stadium"' in prompt and "<solution>" in prompt
    assert r["extra_info"]["question"] in prompt
    assert "wta_1: no CSV for table(s) ['rankings']" in rep.summary()


def spider_levels():
    return ("easy", "medium", "hard", "extra")
