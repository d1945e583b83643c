"""configs/vt_reasoning.py:tiny through the real trainer and the pass-rate command: the
reasoning-gym data written, the curriculum's levels logged per step and restored on
resume, the learning-signal metrics logged, and ``python -m verltool_jax.passrate``
measuring the pool (resumable) and writing the filtered pool."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from verltool_jax.cli import parse_command_line

REPO = Path(__file__).resolve().parents[2]


def _argv(out: Path, *overrides: str) -> list[str]:
    return [
        "--config",
        str(REPO / "configs/vt_reasoning.py") + ":tiny",
        f"--config.trainer.out_dir={out}",
        "--config.logging.progress_bar=false",
        "--config.sampler.backend=jax",
        *[f"--config.{o}" for o in overrides],
    ]


@pytest.fixture(scope="module")
def curriculum_runs(tmp_path_factory):
    """A: 1 RL step with the curriculum (window 1, so a level moves on one group); B: the
    same out_dir resumed to 2 steps."""
    from verltool_jax.train import checkpoint as ck_mod
    from verltool_jax.train.trainer import train

    out = tmp_path_factory.mktemp("rg") / "run"
    cur = [
        "curriculum.enabled=true",
        "curriculum.window=1",
        "curriculum.raise_above=0.01",
        "curriculum.lower_below=0.0",
    ]
    a = train(parse_command_line(_argv(out, "trainer.steps=1", *cur)).config, echo=False)
    saved = a.summary.to_json()
    restored = {}
    orig = ck_mod.Checkpointer.restore

    def spy(self, template, step=None):
        state, data = orig(self, template, step)
        restored["data"] = data
        return state, data

    ck_mod.Checkpointer.restore = spy
    try:
        b = train(parse_command_line(_argv(out, "trainer.steps=2", *cur)).config, echo=False)
    finally:
        ck_mod.Checkpointer.restore = orig
    return {"out": out, "a": saved, "b": b.summary.to_json(), "restored": restored}


def test_curriculum_levels_are_logged_and_resumed(curriculum_runs):
    out = curriculum_runs["out"]
    assert sorted(p.name for p in (out / "data").glob("*.parquet")) == [
        "eval_level0.parquet",
        "eval_level2.parquet",
        "sft.parquet",
        "train.parquet",
    ]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in records if "policy/version" in r]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:
        assert {"curriculum/chain_sum/level", "curriculum/products/level"} <= set(r)
        assert 0.0 <= r["signal/no_signal_frac"] <= 1.0 and r["signal/groups"] == 2
        assert sum(v for k, v in r.items() if k.startswith("signal/pass_rate_")) == pytest.approx(
            1.0
        )
    state = curriculum_runs["restored"]["data"]["prompts"]
    assert state["curriculum"]["level"].keys() == {"chain_sum", "products"}
    assert state["consumed"] >= 2
    # the levels the resumed run started from are those run A logged last
    last_a = rl[0]
    assert {g: float(v) for g, v in state["curriculum"]["level"].items()} == {
        g: last_a[f"curriculum/{g}/level"] for g in ("chain_sum", "products")
    }
    png = (out / "metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_passrate_command_measures_resumes_and_filters(curriculum_runs, tmp_path, capfd):
    from verltool_jax import passrate
    from verltool_jax.data.readers import read_raw

    out = tmp_path / "pr"
    run_dir = curriculum_runs["out"]
    argv = _argv(tmp_path / "cfg", "rollout.max_response_tokens=24") + [
        "--checkpoint",
        str(run_dir),
        "--out",
        str(out),
        "--k",
        "3",
        "--limit",
        "4",
        "--batch",
        "2",
        f"--data={run_dir / 'data' / 'train.parquet'}",
    ]
    assert passrate.main(argv) == 0
    rows = list(csv.DictReader((out / "passrate.csv").open()))
    assert len(rows) == 4 and {r["k"] for r in rows} == {"3"}
    assert all(0 <= int(r["successes"]) <= 3 and float(r["seconds"]) > 0 for r in rows)
    assert {r["group"] for r in rows} <= {"chain_sum", "products"}
    console = capfd.readouterr().out
    assert "pass@1" in console and "pass@3" in console and "successes/3" in console
    # resumable: a second run measures nothing new
    assert (
        passrate.main(
            argv + ["--write_pool", str(out / "pool.parquet"), "--keep_between", "-0.5,0.99"]
        )
        == 2
    )  # bad bounds
    capfd.readouterr()
    pool = out / "pool.parquet"
    code = passrate.main(argv + ["--write_pool", str(pool), "--keep_between", "0,1"])
    console = capfd.readouterr().out
    assert "4 measured before, 0 to go" in console
    kept = [r for r in rows if 0 < float(r["rate"]) < 1]
    if kept:
        assert code == 0 and len(read_raw(pool)) == len(kept)
    else:
        assert code != 0 or not pool.exists()


def test_keep_between_is_strict():
    from verltool_jax.passrate import PromptRate, keep_between, summary

    rates = [PromptRate(str(s), "x", "g", 0, 4, s, 0.0, 10, 1.0) for s in range(5)]
    assert keep_between(rates, 0.0, 1.0) == {"1", "2", "3"}
    assert keep_between(rates, 0.25, 0.75) == {"2"}
    s = summary(rates)
    assert s["histogram"] == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}
    assert s["pass@1"] == pytest.approx(0.5) and s["pass@4"] == pytest.approx(0.8)
