"""The ``spider`` task: its config section, data preparation from a run config,
evaluation metrics, SFT demonstrations and the command line."""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verltool_jax.data.readers import write_rows
from verltool_jax.tasks import EvalReport, TaskFiles
from verltool_jax.tasks.spider.rows import prepare

OBS_TEMPLATE = "<observation>\n{obs}\n</observation>"


@dataclass(frozen=True)
class SpiderTask:
    """The ``task`` config section of text-to-SQL on Spider (``configs/vt_sql.py``)."""

    name: str = "spider"
    spider_dir: str = ""  # required: the Spider folder
    databases: tuple[str, ...] = ()  # empty: every database the query files use
    single_table: bool = False  # only single-table questions
    eval_from: str = "test"  # test: Spider dev = eval | pool: mix, hold out
    num_train: int = 0  # 0: all usable train questions
    num_eval: int = 0  # 0: all usable Spider-dev questions
    num_demos: int = 0  # SFT demonstrations (run the gold query); 0: none
    max_schema_chars: int = 0  # only databases whose schema text is this short; 0: any
    seed: int = 0


TASK_CONFIG = SpiderTask


def eval_metrics(trajectories: Sequence[Any], tokenizer: Any = None) -> EvalReport:
    """Execution accuracy overall and by Spider hardness, SQL calls
    (:func:`~verltool_jax.reporting.eval_metrics.sql_eval_metrics`) of scored trajectories
    (each trajectory's reward and ``reward_info``, as ``assign_rewards`` wrote them)."""
    from verltool_jax.reporting.eval_metrics import format_metrics, sql_eval_metrics
    from verltool_jax.rewards.base import RewardResult

    rewards = [
        None
        if t.reward is None
        else RewardResult(t.reward, bool(t.reward_info.get("acc")), dict(t.reward_info))
        for t in trajectories
    ]
    m = sql_eval_metrics(trajectories, rewards)
    title = "text-to-SQL (greedy; execution accuracy by Spider hardness)"
    return EvalReport("sql", title, m, format_metrics(m))


EVAL_METRICS = eval_metrics


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """Prepare Spider from ``config.task.spider_dir`` into ``out_dir``, limited to
    ``config.task.databases`` if non-empty and to single-table questions if
    ``config.task.single_table``. ``eval_from="test"``: train rows from
    ``train_queries.csv``, eval rows from ``test_queries.csv`` (the Spider dev set, on
    other databases); ``"pool"``: both files mixed and shuffled, ``num_eval`` held out.
    ``num_train`` / ``num_eval`` (> 0) subsample with ``config.task.seed``;
    ``num_demos`` > 0 writes that many SFT demonstrations from the train rows
    (:func:`demonstrations`). ``max_schema_chars`` > 0 keeps only questions on databases
    whose schema text (the prompt's ``CREATE TABLE`` statements) is at most that long:
    for models with a short context, or a CPU budget, where prompt length is the cost."""
    t = config.task
    if t.max_schema_chars < 0:
        raise ValueError(
            f"task.max_schema_chars={t.max_schema_chars} must be >= 0 "
            f"(0: databases of any schema size)"
        )
    if not t.spider_dir:
        raise ValueError(
            "task.spider_dir is empty: pass the Spider folder "
            "(test_queries.csv, train_queries.csv, databases/), e.g. "
            "--config.task.spider_dir=/data/spider"
        )
    dbs = tuple(t.databases) or None
    rep = prepare(
        t.spider_dir,
        out_dir,
        ("test", "train"),
        dbs,
        bool(t.single_table),
        config.rollout.max_turns,
        write=False,
    )
    out = Path(out_dir)
    rng = random.Random(t.seed)
    if t.eval_from == "test":
        pools = {"train": rep.row_data.get("train", []), "eval": rep.row_data.get("test", [])}
    elif t.eval_from == "pool":
        rows = rep.row_data.get("test", []) + rep.row_data.get("train", [])
        rng.shuffle(rows)
        n_eval = t.num_eval or len(rows) // 5
        pools = {"eval": rows[:n_eval], "train": rows[n_eval:]}
    else:
        raise ValueError(
            f"task.eval_from must be 'test' (train rows from train_queries.csv, "
            f"eval rows from test_queries.csv) or 'pool' (both files mixed, "
            f"num_eval held out), got {t.eval_from!r}"
        )
    if t.max_schema_chars:
        pools = {
            name: [
                r for r in rows if rep.schema_chars[r["extra_info"]["db_id"]] <= t.max_schema_chars
            ]
            for name, rows in pools.items()
        }
    files = {}
    for name, limit in (("train", t.num_train), ("eval", t.num_eval)):
        rows = pools[name]
        if limit and limit < len(rows):
            rows = rng.sample(rows, limit)
        if not rows:
            raise ValueError(
                f"Spider has no usable {name} question for databases={dbs} "
                f"single_table={bool(t.single_table)} eval_from={t.eval_from!r} "
                f"max_schema_chars={t.max_schema_chars} "
                f"(Spider's train and test databases are disjoint; "
                f"eval_from='pool' splits one set of databases):\n{rep.summary()}"
            )
        files[name] = write_rows(rows, out / f"{name}.parquet")
        pools[name] = rows
    (out / "prepare_report.txt").write_text(rep.summary() + "\n")
    if t.num_demos < 0:
        raise ValueError(f"task.num_demos={t.num_demos} must be >= 0 (0: no demonstrations)")
    sft = demonstrations(config, pools["train"], t.num_demos, t.seed) if t.num_demos else []
    return TaskFiles(
        train=files["train"],
        eval=files["eval"],
        sft=write_rows(sft, out / "sft.parquet") if sft else None,
    )


def solution_after(observation: str, gold: str) -> str | None:
    """``<solution>GOLD</solution>`` once the gold query's result came back; None when
    the tool answered with an error (the query did not run there)."""
    if observation.startswith(("SQL error", "Error")):
        return None
    return f"<solution>{gold}</solution>"


def demonstrations(config, rows: Sequence[dict], num_demos: int, seed: int) -> list[dict]:
    """SFT rows for up to ``num_demos`` training ``rows`` (in an order shuffled by
    ``seed``): run the gold query with the sql tool, read its real result, give the gold
    query as the solution (:mod:`verltool_jax.tasks.demonstrations`)."""
    from verltool_jax.tasks.demonstrations import Proposal, demonstrate

    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    proposals = []
    for i in order:
        gold = rows[i]["reward_model"]["ground_truth"]
        proposals.append(
            Proposal(
                rows[i], f"<sql>{gold}</sql>", lambda obs, gold=gold: solution_after(obs, gold)
            )
        )
    return demonstrate(config, proposals, num_demos)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Spider (MySQL dump layout) to sqlite, the gold-query check, and VT-SQL rows"
    )
    ap.add_argument(
        "--spider-dir",
        required=True,
        help="folder with test_queries.csv, "
        "train_queries.csv and databases/<db>/{schema.sql,data/*.csv}",
    )
    ap.add_argument("--out", required=True, help="output folder (sqlite files + parquet)")
    ap.add_argument("--splits", default="test,train")
    ap.add_argument(
        "--databases",
        default="",
        help="comma-separated db ids (default: all that the query files use)",
    )
    ap.add_argument(
        "--single-table", action="store_true", help="rows only for single-table questions"
    )
    ap.add_argument("--json", default="", help="also write the report as JSON here")
    args = ap.parse_args(argv)
    dbs = [d for d in args.databases.split(",") if d] or None
    rep = prepare(
        args.spider_dir, args.out, [s for s in args.splits.split(",") if s], dbs, args.single_table
    )
    print(rep.summary())
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "queries_total": rep.queries_total,
                    "queries_ok": rep.queries_ok,
                    "failures": rep.failures,
                    "rows": rep.rows,
                    "files": rep.files,
                    "databases": [d.__dict__ for d in rep.databases],
                },
                indent=1,
            )
        )
    return 0
