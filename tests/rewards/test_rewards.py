"""Rewards: hand-checked math / QA / SQL scores, shaping, and the parallel pool's timeouts."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
import support.rewards_testlib as rewards_testlib  # noqa: F401  (registers test_sleep / test_wedged / test_raises)
from support.tiny_data import tiny_tokenizer

from verltool_jax.rewards import (
    RewardItem,
    RewardPool,
    ShapingSettings,
    assign_rewards,
    extract_answer,
    get_reward_fn,
    resolve_reward_name,
)
from verltool_jax.rewards.math_reward import math_equivalent
from verltool_jax.rewards.qa_reward import exact_match, f1_score, normalize_answer
from verltool_jax.rewards.sql_reward import SQLExecutionError, execute_readonly, extract_sql
from verltool_jax.rollout.response_text import model_text, response_segments
from verltool_jax.rollout.trajectory import Trajectory


def row(gt, ds="tiny_math", **extra):
    return {"data_source": ds, "reward_model": {"ground_truth": gt}, "extra_info": extra}


def test_answer_extraction():
    assert extract_answer("<answer>1</answer> then <answer> 42 </answer>") == "42"
    assert extract_answer(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert extract_answer(r"<answer>\boxed{7}</answer>") == "7"
    assert extract_answer(r"\boxed{a} and \boxed{{x}^{2}}") == "{x}^{2}"
    assert extract_answer("no answer here") is None
    assert extract_answer(r"\boxed{unbalanced") is None


@pytest.mark.parametrize(
    "pred, gold, ok",
    [
        ("18002604", "18002604", True),
        ("18,002,604", "18002604", True),
        ("18002605", "18002604", False),
        ("0.5", r"\frac{1}{2}", True),
        ("1/2", "0.5", True),
        ("$3$.", "3", True),
        ("3.0", "3", True),
        ("2.9999", "3", False),
        ("x^2+2x+1", "(x+1)^2", True),
        (r"\sqrt{8}", r"2\sqrt{2}", True),
        ("x+2", "x+1", False),
    ],
)
def test_math_equivalence(pred, gold, ok):
    assert math_equivalent(pred, gold) is ok


def test_math_reward_scores():
    fn = get_reward_fn("math")
    r = fn("<python>print(1234 * 5678)</python><answer>7006652</answer>", "7006652", {})
    assert (r.score, r.correct, r.info["pred"]) == (1.0, True, "7006652")
    r = fn("<answer>7006653</answer>", "7006652", {})
    assert (r.score, r.correct) == (0.0, False)
    r = fn("7006652", "7006652", {})  # no <answer>/boxed: no credit
    assert (r.score, r.info["has_answer"]) == (0.0, False)


def test_qa_em_f1_hand_values():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert exact_match("the eiffel tower", ["Eiffel Tower"]) == 1.0
    # pred tokens [paris, france], gold [paris]: P=1/2, R=1, F1=2/3
    assert f1_score("Paris, France", ["Paris"]) == pytest.approx(2 / 3)
    assert f1_score("Lyon", ["Paris", "lyon city"]) == pytest.approx(2 * 1 * 0.5 / 1.5)
    r = get_reward_fn("qa_f1")("<answer>Paris France</answer>", {"target": ["Paris"]}, {})
    assert r.score == pytest.approx(2 / 3) and r.correct is False
    r = get_reward_fn("qa_em")("<answer>paris</answer>", ["Paris", "City of Light"], {})
    assert (r.score, r.correct) == (1.0, True)
    assert resolve_reward_name("searchR1_nq") == "qa_em"  # prefix routing


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql") / "shop.sqlite"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE items (id INTEGER, name TEXT, price REAL)")
        c.executemany(
            "INSERT INTO items VALUES (?, ?, ?)",
            [(1, "pen", 1.5), (2, "book", 12.0), (3, "bag", 30.25), (4, "ink", 1.5)],
        )
    return str(path)


def test_sql_execution_match(db):
    fn = get_reward_fn("sql")
    gold = "SELECT name FROM items WHERE price < 2"
    same_set = "<sql>SELECT name FROM items WHERE price = 1.5 ORDER BY id DESC</sql>"
    assert fn(same_set, gold, {"db_path": db}).score == 1.0  # set equality, other order
    ordered_gold = "SELECT name FROM items WHERE price < 2 ORDER BY id"
    assert fn(same_set, ordered_gold, {"db_path": db}).score == 0.0  # ORDER BY: order counts
    assert fn("<answer>SELECT name FROM items</answer>", gold, {"db_path": db}).score == 0.0
    bad = fn("<sql>SELECT nme FROM items</sql>", gold, {"db_path": db})
    assert bad.score == 0.0 and "no such column" in bad.info["exec_error"]
    assert (
        fn(
            "```sql\nSELECT name FROM items WHERE id IN (1,4)\n```",
            {"sql": gold, "db_path": db},
            {},
        ).score
        == 1.0
    )
    assert extract_sql("<solution>SELECT 1</solution>") == "SELECT 1"
    with pytest.raises(SQLExecutionError, match="only a single SELECT"):
        execute_readonly(db, "DELETE FROM items")
    with pytest.raises(SQLExecutionError, match="only a single SELECT"):
        execute_readonly(db, "SELECT 1; DROP TABLE items")
    with pytest.raises(
        SQLExecutionError, match="attempt to write a readonly database|only a single SELECT"
    ):
        execute_readonly(db, "WITH x AS (SELECT 1) INSERT INTO items VALUES (9,'x',1)")
    assert len(execute_readonly(db, "SELECT * FROM items")) == 4  # nothing was changed
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    t0 = time.monotonic()
    with pytest.raises(SQLExecutionError, match="timed out"):
        execute_readonly(db, slow, timeout_s=0.3)
    assert time.monotonic() - t0 < 3
    with pytest.raises(ValueError, match="extra_info.db_path"):
        fn("<sql>SELECT 1</sql>", gold, {})


def test_unknown_data_source_names_fix():
    with pytest.raises(
        ValueError,
        match="no reward function for data_source 'tiny_mth'.*"
        "did you mean 'tiny_math'.*reward.name",
    ):
        resolve_reward_name("tiny_mth")
    with pytest.raises(ValueError, match="unknown reward function 'nope'"):
        resolve_reward_name("tiny_math", "nope")


@pytest.fixture(scope="module")
def pool():
    # grace_s: how long past timeout_s the pool waits for a worker's own timer before it
    # kills the worker; generous, so a loaded machine (a niced CI beside a training run)
    # does not turn a timer-stopped call into a kill
    with RewardPool(
        num_workers=2,
        timeout_s=1.0,
        grace_s=10.0,
        warm_up=False,
        reward_modules=("support.rewards_testlib",),
        shaping=ShapingSettings(format_penalty=0.5, tool_use_bonus=0.1, invalid_tool_penalty=0.2),
    ) as p:
        p.score([("<answer>1</answer>", row("1"))])  # start the workers outside the timings
        yield p


def test_pool_scores_in_parallel_with_timeouts(pool):
    items = [
        ("<answer>6</answer>", row("6")),
        ("<answer>7</answer>", row("6")),
        ("no answer", row("6")),
        RewardItem("x", "1", "test_sleep", {"sleep_s": 120}),
        RewardItem("x", "1", "test_raises"),
        RewardItem("x", "1", "test_sleep", {"sleep_s": 0.01}),
        RewardItem("x", "1", "test_verify_then_sleep"),
    ]
    t0 = time.monotonic()
    res = pool.score(items)
    assert time.monotonic() - t0 < 60  # not the 120 s the sleeper wanted
    assert [r.score for r in res] == [1.0, 0.0, -0.5, 0.0, 0.0, 1.0, 0.0]  # -0.5: format
    for r in (res[3], res[6]):  # stopped by the worker's own timer, not by a kill
        assert r.info["timeout"] is True and "killed" not in r.info
    assert "broken verifier" in res[4].info["error"]
    assert pool.restarts == 0


def test_wedged_worker_is_killed_and_replaced(pool):
    items = [
        RewardItem("x", "1", "test_wedged", {"sleep_s": 120}),
        ("<answer>6</answer>", row("6")),
    ]
    t0 = time.monotonic()
    res = pool.score(items)
    assert time.monotonic() - t0 < 60  # not the 120 s of the wedged call
    assert res[0].info.get("killed") is True and res[1].score == 1.0
    assert pool.restarts == 1
    assert pool.score([("<answer>5</answer>", row("5"))])[0].score == 1.0  # fresh pool works


def test_trajectories_scored_off_the_event_loop(pool):
    tok = tiny_tokenizer()
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    act, obs, ans = (
        enc("<python>print(2 * 3)</python>"),
        enc("<result>\n<answer>9</answer>\n</result>"),
        enc("<answer>6</answer>"),
    )
    traj = Trajectory(
        trajectory_id="t0",
        group_id="g0",
        prompt_ids=enc("What is 2 * 3?"),
        response_ids=act + obs + ans,
        loss_mask=[1] * len(act) + [0] * len(obs) + [1] * len(ans),
        logprobs=[0.0] * (len(act) + len(obs) + len(ans)),
        versions=[0] * (len(act) + len(obs) + len(ans)),
        tool_calls=1,
        invalid_tool_calls=1,
        data=row("6"),
    )
    segs = response_segments(traj.response_ids, traj.loss_mask, tok)
    assert [m for _, m in segs] == [True, False, True]
    assert (
        model_text(traj.response_ids, traj.loss_mask, tok)
        == "<python>print(2 * 3)</python><answer>6</answer>"
    )  # the tool's <answer> is ignored

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        res = await pool.score_async(
            [traj, RewardItem("x", "1", "test_sleep", {"sleep_s": 0.5})], tokenizer=tok
        )
        t.cancel()
        return res, ticks

    res, ticks = asyncio.run(main())
    assert ticks >= 10  # the loop kept running meanwhile
    assert res[0].score == pytest.approx(1.0 + 0.1 - 0.2)  # correct + tool bonus - invalid call
    assign_rewards([traj], res[:1])
    assert traj.reward == pytest.approx(0.9) and traj.reward_info["acc"] == 1.0


def test_batch_summary_counts_reward_failures():
    from verltool_jax.reporting.batch_summary import summarize
    from verltool_jax.rewards import RewardResult
    from verltool_jax.rollout.trajectory import Trajectory

    res = [
        RewardResult(1.0, True, {"has_answer": True, "seconds": 0.2}),
        RewardResult(-0.5, False, {"has_answer": False}),
        RewardResult(0.0, False, {"timeout": True}),
        RewardResult(0.0, False, {"error": "x"}),
    ]
    trajs = [Trajectory(f"t{i}", "g", [1], response_ids=[2, 3]) for i in range(4)]
    assign_rewards(trajs, res)
    m = summarize(trajs, "eval")
    assert m["eval/reward"] == pytest.approx(0.125) and m["eval/acc"] == 0.25
    assert (m["eval/reward_timeouts"], m["eval/reward_errors"], m["eval/no_answer"]) == (1, 1, 1)
    assert m["eval/num"] == 4 and m["eval/response_len"] == 2.0
    assert summarize([], "eval") == {}


def test_worker_start_failure_is_a_clear_error():
    pool = RewardPool(
        num_workers=1,
        reward_modules=("support.rewards_badworker",),
        startup_timeout_s=60,
        warm_up=False,
    )
    with pytest.raises(
        RuntimeError, match="reward workers failed to start: ImportError: plugin needs a GPU"
    ):
        pool.score([("<answer>1</answer>", row("1"))])
    assert pool._pool is None
    with pytest.raises(ModuleNotFoundError):
        RewardPool(num_workers=1, reward_modules=("no_such_reward_module_xyz",))
