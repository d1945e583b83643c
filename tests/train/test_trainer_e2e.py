"""End-to-end training through the real components: the tiny_math smoke config
with the real tool server (sandboxed python), the real vLLM CPU sampler, the reward pool,
the jitted train step, weight resync, orbax checkpoints, metrics, plot and HTML report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import jax
import numpy as np
import pytest

from verltool_jax.cli import ConfigError, parse_command_line

REPO = Path(__file__).resolve().parents[2]


def _config(out_dir: Path, *overrides: str):
    argv = [
        "--config",
        str(REPO / "configs/tiny_math.py") + ":smoke",
        f"--config.trainer.out_dir={out_dir}",
        "--config.logging.progress_bar=false",
    ]
    return parse_command_line(argv + [f"--config.{o}" for o in overrides]).config


def _flat(params) -> dict:
    return {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Run A: 2 async RL steps from scratch with the vLLM sampler. Run B: same out_dir,
    3 steps, sync mode, JAX sampler: resumes from A's checkpoint and does one more step."""
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.train.trainer import train

    out = tmp_path_factory.mktemp("e2e") / "run"
    a = train(_config(out, "trainer.steps=2"), echo=False)
    summary_a = a.summary.to_json()
    init = load_hf(out / "init_model")
    restored_from = {}
    orig_restore = None

    from verltool_jax.train import checkpoint as ck_mod

    orig_restore = ck_mod.Checkpointer.restore

    def spy(self, template, step=None):
        state, data = orig_restore(self, template, step)
        restored_from["params"] = _flat(state.params)
        restored_from["step"] = int(state.step)
        restored_from["data"] = data
        return state, data

    ck_mod.Checkpointer.restore = spy
    try:
        b = train(
            _config(out, "trainer.steps=3", "rollout.mode=sync", "sampler.backend=jax"), echo=False
        )
        summary_b = b.summary.to_json()
    finally:
        ck_mod.Checkpointer.restore = orig_restore
    return dict(
        out=out,
        a=a,
        b=b,
        summary_a=summary_a,
        summary_b=summary_b,
        init=init,
        restored=restored_from,
    )


def test_weights_change_and_versions_advance(two_runs):
    from flax import nnx

    a = two_runs["a"]
    init = _flat(nnx.state(two_runs["init"], nnx.Param))
    after = _flat(a.state.params)
    assert init.keys() == after.keys()
    changed = [k for k in init if not np.array_equal(init[k], after[k])]
    assert len(changed) == len(init), f"unchanged params: {set(init) - set(changed)}"
    assert two_runs["summary_a"]["steps"] == 2
    assert a.policy_version == 2  # the sampler got every new version
    records = [json.loads(x) for x in (two_runs["out"] / "metrics.jsonl").read_text().splitlines()]
    versions = [r["policy/version"] for r in records if "policy/version" in r]
    assert versions == [1, 2, 3]  # A: 1, 2; B (resumed): 3
    rl = [r for r in records if "policy/version" in r]
    for r in rl:
        assert 0.0 <= r["reward/mean"] <= 1.0 and r["time/train_s"] > 0
        assert r["rollout/errors"] == 0
    # Sampler vs trainer logprobs on the tokens sampled by the current version (fp32).
    diffs = [r["sync/logprob_diff_mean"] for r in rl if "sync/logprob_diff_mean" in r]
    assert diffs and max(diffs) < 1e-3, diffs


def test_resume_restores_exactly(two_runs):
    a, b, restored = two_runs["a"], two_runs["b"], two_runs["restored"]
    assert restored["step"] == 2
    saved = _flat(a.state.params)
    assert saved.keys() == restored["params"].keys()
    for k in saved:
        np.testing.assert_array_equal(saved[k], restored["params"][k], err_msg=k)
    assert restored["data"]["prompts"]["consumed"] >= 2 * 2  # 2 steps x 2 groups started
    assert two_runs["summary_b"]["steps"] == 3
    assert int(b.state.step) == 3
    steps = sorted(
        int(p.name) for p in (two_runs["out"] / "checkpoints").iterdir() if p.name.isdigit()
    )
    assert steps[-1] == 3 and len(steps) <= 2  # keep_ckpts=2


def test_outputs_written(two_runs):
    out = two_runs["out"]
    png = (out / "metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    html = (out / "trajectories.html").read_text()
    assert "&lt;python&gt;" in html and "<html" in html.lower()
    # the last batch's tokens carry the trainer's logprobs and entropies (the token pass)
    boxes = [json.loads(unescape(x)) for x in re.findall(r'data-tok="([^"]*)"', html)]
    scored = [d for d in boxes if "t" in d and "e" in d]
    assert scored and any(x is not None for d in scored for x in d["t"])
    assert (out / "tensorboard").is_dir() and any((out / "tensorboard").iterdir())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["eval_after"] is not None
    assert (out / "data" / "train.parquet").is_file()


def test_bad_override_fails_before_work(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "verltool_jax.train",
            "--config",
            "configs/tiny_math.py:smoke",
            "--config.rollout.max_turnz=3",
            f"--config.trainer.out_dir={tmp_path / 'x'}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "rollout.max_turnz" in r.stderr
    assert not (tmp_path / "x").exists()  # nothing was started
    with pytest.raises(ConfigError, match="rollout.max_turns"):
        _config(tmp_path, "rollout.max_turns=three")


def test_bad_data_row_is_a_clear_error(tmp_path):
    from verltool_jax.train.trainer import train

    bad = tmp_path / "bad.jsonl"
    rows = [
        {
            "prompt": [{"role": "user", "content": "1+1?"}],
            "data_source": "tiny_math",
            "reward_model": {"ground_truth": "2"},
        },
        {
            "prompt": "not a list of messages",
            "data_source": "tiny_math",
            "reward_model": {"ground_truth": "3"},
        },
    ]
    bad.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = _config(tmp_path / "run", f"data.train_files=('{bad}',)", "sft.steps=0")
    with pytest.raises(ValueError, match=r"row 1.*prompt"):
        train(cfg, echo=False)


def test_eval_entry_point_scores_the_checkpoint(two_runs, capfd, tmp_path):
    from verltool_jax import eval as eval_cli

    report = tmp_path / "eval.html"
    rc = eval_cli.main(
        [
            "--config",
            str(REPO / "configs/tiny_math.py") + ":smoke",
            "--config.sampler.backend=jax",
            "--config.logging.progress_bar=false",
            "--checkpoint",
            str(two_runs["out"]),
            "--report",
            str(report),
        ]
    )
    assert rc == 0
    out = capfd.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("[eval] orbax checkpoint"))
    assert "step 3" in line
    metrics = json.loads(line.split(": ", 1)[1])
    assert metrics["eval/num"] == 8 and 0.0 <= metrics["eval/acc"] <= 1.0
    assert "&lt;python&gt;" in report.read_text() or "tool calls" in report.read_text()
    assert (
        eval_cli.main(
            ["--config", "configs/tiny_math.py:smoke", "--checkpoint", str(tmp_path / "missing")]
        )
        == 2
    )


def test_console_shows_the_trainer_and_the_log_file_the_libraries(tmp_path):
    """`python -m verltool_jax.train`: the console has the trainer's own lines (and says
    where the library log is); vLLM/XLA/tool-server output lands in <out_dir>/run.log."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "verltool_jax.train",
            "--config",
            "configs/tiny_math.py:smoke",
            f"--config.trainer.out_dir={out}",
            "--config.logging.progress_bar=false",
            "--config.trainer.steps=1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    console = r.stdout + r.stderr
    assert f"library logs (vLLM, XLA, tool server) go to {out}/run.log" in console
    assert "[sft] step 2/2" in console and "[trainer] done" in console
    assert "step 1/1 | reward" in console  # the progress line
    assert " INFO " not in console and "WARNING" not in console  # no library lines
    log = (out / "run.log").read_text()
    assert "vllm" in log.lower() and " INFO " in log  # they went to the log
    # Start-up, split into its parts: one console line after the first step, the same
    # figures in that step's metrics and in summary.json.
    line = next(x for x in console.splitlines() if "[trainer] start-up" in x)
    for part in ("imports", "model", "tokenizer", "data", "tool server", "engine (waited)"):
        assert f" {part} " in line, (part, line)
    assert "first weight push" in line and "train step" in line and "log-prob pass" in line
    startup = json.loads((out / "summary.json").read_text())["startup"]
    total = startup["to_first_step_s"]
    assert total >= startup["imports_s"] + startup["engine_waited_s"] > 0
    assert startup["compile_train_step_s"] > 0 and startup["engine_background_s"] > 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    with_startup = [r for r in records if "startup/to_first_step_s" in r]
    assert [r["step"] for r in with_startup] == [1]  # the first step's record only
    assert with_startup[0]["startup/to_first_step_s"] == total
    # The compilation cache is on by default, beside the run, one folder per JAX version.
    cache = tmp_path / ".jax_cache" / f"jax-{jax.__version__}-xla-"
    folders = list(cache.parent.glob(cache.name + "*"))
    assert len(folders) == 1 and any(folders[0].iterdir()), folders
    assert str(folders[0]) in line
    # The tiny model is kept there for the next run (tests/train/test_startup.py).
    assert len(list((tmp_path / ".jax_cache").glob("tiny-model-*/config.json"))) == 1


def _rewards_by_batch(monkeypatch, mixed: list[bool]):
    """Training batches get all-zero rewards, or mixed ones (0, 1, 0, 1 in each group),
    batch by batch as ``mixed`` says (then mixed): a task whose difficulty the test sets."""
    from verltool_jax.train import trainer as trainer_mod

    real, calls = trainer_mod.score_episodes, iter(mixed)

    async def scored(pool, trajs, tokenizer, rule):
        await real(pool, trajs, tokenizer, rule)
        mix = next(calls, True)
        for i, t in enumerate(trajs):
            t.reward = float(mix and i % 2)

    monkeypatch.setattr(trainer_mod, "score_episodes", scored)


def test_dynamic_sampling_samples_again_when_no_group_has_a_signal(tmp_path, monkeypatch):
    """With ``algo.dynamic_sampling`` a batch whose groups all have equal rewards is not a
    step: no metrics row, evaluation or checkpoint for it, no weight push; another batch
    is sampled, and the step that follows says how many were dropped."""
    from verltool_jax.train import trainer as trainer_mod

    _rewards_by_batch(monkeypatch, [False, False, True])
    out = tmp_path / "ds"
    r = trainer_mod.train(
        _config(
            out,
            "algo.dynamic_sampling=true",
            "trainer.steps=2",
            "trainer.eval_every=1",
            "rollout.mode=sync",
            "sampler.backend=jax",
        ),
        echo=False,
    )
    assert r.summary.steps == 2 and r.policy_version == 2
    # the no-signal filter's prompts are seen, not trained and not rolled out again
    d = r.summary.data
    assert d is not None and d["ok"], d
    assert (d["drawn"], d["trained"], d["no_signal"], d["in_flight"]) == (8, 4, 4, 0)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "batch/uninformative_batches" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert [row["batch/uninformative_batches"] for row in steps] == [2, 0]
    assert all(row["batch/informative_frac"] > 0 for row in steps)
    evals = [row["step"] for row in rows if "eval/acc" in row]
    assert evals == [0, 1, 2]  # start, eval_every=1, final


def test_dynamic_sampling_stops_after_its_limit_of_empty_batches(tmp_path, monkeypatch):
    """``algo.dynamic_sampling_max_batches`` batches in a row with no signal stop the run
    with an error naming the setting, the state saved."""
    from verltool_jax.train import trainer as trainer_mod
    from verltool_jax.train.checkpoint import Checkpointer

    _rewards_by_batch(monkeypatch, [False] * 10)
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError, match="dynamic_sampling_max_batches=2"):
        trainer_mod.train(
            _config(
                out,
                "algo.dynamic_sampling=true",
                "algo.dynamic_sampling_max_batches=2",
                "trainer.steps=2",
                "rollout.mode=sync",
                "sampler.backend=jax",
            ),
            echo=False,
        )
    assert Checkpointer(out / "checkpoints", save_every=1).all_steps() == [0]
    with pytest.raises(ConfigError, match="dynamic_sampling_max_batches"):
        _config(out, "algo.dynamic_sampling_max_batches=-1")


def test_sft_stage_without_a_held_out_set_starts_no_sampler(tmp_path, monkeypatch):
    """An SFT-only stage with nothing to evaluate (the experiments' warm starts, evaluated
    separately) samples nothing: no sampler is started (a vLLM engine costs a minute and
    gigabytes), yet the warm start is trained, checkpointed and exported."""
    from flax import nnx

    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.train import build
    from verltool_jax.train import trainer as trainer_mod

    def refuse(*a, **kw):
        raise AssertionError("a sampler was started for a run that samples nothing")

    monkeypatch.setattr(build, "make_sampler", refuse)
    out = tmp_path / "sft"
    r = trainer_mod.train(
        _config(out, "stage=sft", "data.max_eval_examples=0", "checkpoint.export_hf=true"),
        echo=False,
    )
    assert r.summary.steps == 0 and not r.summary.interrupted
    assert r.summary.eval_before is None and r.summary.eval_after is None
    assert json.loads((out / "summary.json").read_text())["steps"] == 0
    exported = load_hf(out / "hf_model")
    got = _flat(nnx.state(exported, nnx.Param))
    want = _flat(r.state.params)
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[k], want[k]) for k in got)
    init = _flat(nnx.state(load_hf(out / "init_model"), nnx.Param))
    assert any(not np.array_equal(got[k], init[k]) for k in got)  # the warm start ran


def test_sft_stage_evaluates_the_held_out_set_once(tmp_path, monkeypatch):
    """``stage=sft`` trains no RL step, so the policy evaluated after the warm start is the
    final one: one pass over the held-out set (it took two, doubling a 30-minute SmolLM2
    evaluation), its figures reported as before and after."""
    from verltool_jax.train import evaluate as evaluate_mod
    from verltool_jax.train import trainer as trainer_mod

    calls = []
    real = evaluate_mod.evaluate

    async def counting(*a, **kw):
        calls.append(len(a[1]))
        return await real(*a, **kw)

    monkeypatch.setattr(evaluate_mod, "evaluate", counting)
    r = trainer_mod.train(_config(tmp_path / "sft", "stage=sft", "sampler.backend=jax"), echo=False)
    assert calls == [8]  # data.max_eval_examples
    assert r.summary.steps == 0 and r.summary.eval_after == r.summary.eval_before
    assert r.summary.eval_before is not None


def test_group_reward_terms_are_added_by_the_trainer(tmp_path, monkeypatch):
    """``reward.curiosity_alpha`` / ``reward.extra_call_penalty`` (the Pixel-Reasoner terms):
    the trainer adds them to every scored group; the trained trajectories carry them, each
    one computed from its group's valid tool calls, and the step logs their means. (The
    tiny model's tool calls are set to 0, 1, 2, ... at scoring, so groups differ.)"""
    from verltool_jax.rewards.visual_reward import CuriositySettings, curiosity_terms
    from verltool_jax.rollout.trajectory import load_trajectories
    from verltool_jax.train import trainer as trainer_mod
    from verltool_jax.train.trainer import train

    orig = trainer_mod.score_episodes

    async def scored(pool, trajs, tokenizer, rule):
        await orig(pool, trajs, tokenizer, rule)
        for i, t in enumerate(trajs):
            t.tool_calls, t.invalid_tool_calls = i % 3, 0

    monkeypatch.setattr(trainer_mod, "score_episodes", scored)
    out = tmp_path / "cur"
    train(
        _config(
            out,
            "trainer.steps=1",
            "rollout.mode=sync",
            "sampler.backend=jax",
            "reward.curiosity_alpha=0.5",
            "reward.curiosity_rate_bound=1.0",
            "reward.extra_call_penalty=0.05",
            "logging.dump_trajectories=true",
        ),
        echo=False,
    )
    trajs = load_trajectories(out / "trained" / "step_00001.jsonl")
    groups: dict = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    settings = CuriositySettings(rate_bound=1.0, alpha=0.5, free_calls=1, beta=0.05)
    for g in groups.values():
        terms = curiosity_terms([t.tool_calls - t.invalid_tool_calls for t in g], settings)
        for t, (b, p) in zip(g, terms):
            assert t.reward_info["curiosity_bonus"] == pytest.approx(b)
            assert t.reward_info["extra_call_penalty"] == pytest.approx(p)
    assert any(t.reward_info["curiosity_bonus"] > 0 for t in trajs)
    assert any(t.reward_info["extra_call_penalty"] < 0 for t in trajs)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if "reward/curiosity_bonus" in r]
    assert step["reward/curiosity_bonus"] == pytest.approx(
        np.mean([t.reward_info["curiosity_bonus"] for t in trajs])
    )
