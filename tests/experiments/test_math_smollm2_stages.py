"""experiments/math_smollm2.py's stage control, fast: ``--stages`` is checked, and an
interrupted training stage records nothing (the full smoke run is in
test_math_smollm2_smoke.py, slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.experiment_scripts import load_experiment

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / ".." / "shared" / "data"


def _script():
    return load_experiment("math_smollm2")


@pytest.mark.parametrize("stages", ["sft", "grpo"])
def test_an_interrupted_stage_records_nothing_and_stops_the_experiment(
    tmp_path, capsys, monkeypatch, stages
):
    """A training run stopped by a signal returns an ``interrupted`` summary (the trainer's
    own tests cover that); the experiment must neither evaluate nor record it (a stopped
    GRPO run once left the SFT model's accuracy in grpo_seed1.json), and says how to go on.
    The trainer is replaced by one that reports an interruption; no stage runs for real."""
    if not (DATA / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("real data not present beside the repo (../shared/data)")
    import verltool_jax.eval
    import verltool_jax.train.trainer as trainer_mod

    script = _script()
    out = tmp_path / "exp"
    if stages == "grpo":
        (out / "sft_seed1" / "hf_model").mkdir(parents=True)

    from verltool_jax.train.summary import RunSummary

    class Stopped:
        summary = RunSummary(steps=3, interrupted=True, wall_s=1.0)

    monkeypatch.setattr(trainer_mod, "train", lambda c: Stopped())
    monkeypatch.setattr(
        verltool_jax.eval,
        "run_eval",
        lambda *a, **k: pytest.fail("an interrupted stage was evaluated"),
    )
    argv = [
        "--smoke",
        "--data-dir",
        str(DATA),
        "--out",
        str(out),
        "--seeds",
        "1",
        "--stages",
        stages,
    ]
    assert script.main(argv) == 130
    assert (
        f"{stages} seed 1 was interrupted at step 3; run the same command"
        in capsys.readouterr().out
    )
    assert not list(out.glob("*.json")) and not (out / "results.md").exists()


def test_stages_option_is_checked(tmp_path):
    if not (DATA / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("real data not present beside the repo (../shared/data)")
    script = _script()
    with pytest.raises(SystemExit):
        script.main(["--smoke", "--data-dir", str(DATA), "--out", str(tmp_path), "--stages", "rl"])
    with pytest.raises(SystemExit):  # GRPO needs the SFT export
        script.main(
            ["--smoke", "--data-dir", str(DATA), "--out", str(tmp_path), "--stages", "grpo"]
        )


def test_filter_option_is_parsed_and_checked(tmp_path):
    """``--filter K[,LO,HI]`` (the pass-rate filter before GRPO) as typed values; a bad
    one stops before any work with a message naming the flag."""
    _script()  # puts experiments/ on the path
    from sft_grpo_stages import parse_filter

    assert parse_filter("8") == (8, 0.0, 1.0)
    assert parse_filter("4,0.1,0.9") == (4, 0.1, 0.9)
    for bad in ("0", "8,0.5", "8,0.9,0.1", "x", "8,-1,1"):
        assert parse_filter(bad) is None
    with pytest.raises(SystemExit):
        _script().main(["--data-dir", str(tmp_path), "--filter", "8,0.9,0.1"])


def test_results_md_has_a_sampled_table_per_sampled_mode(tmp_path):
    """Greedy rows make the first table; rows of a ``T=..,n=k`` evaluation add a table of
    pass@1 / pass@k, mean ± half the spread over seeds, per stage and set."""
    _script()  # puts experiments/ on the path
    from sft_grpo_stages import write_tables

    def row(stage, seed, mode, name, acc, **more):
        return {"stage": stage, "seed": seed, "mode": mode, "set": name, "acc": acc,
                "stage_wall_s": 10.0, **more}  # fmt: skip

    rows = [
        row("sft", 1, "greedy", "a", 0.2),
        row("sft", 2, "greedy", "a", 0.4),
        row("sft", 1, "T=0.6,n=8", "a", 0.1, **{"pass@8": 0.5}),
        row("sft", 2, "T=0.6,n=8", "a", 0.3, **{"pass@8": 0.7}),
        row("grpo", 1, "greedy", "a", 0.6),
    ]
    write_tables(rows, tmp_path, "t", "accuracy")
    md = (tmp_path / "results.md").read_text()
    greedy, _, sampled = md.partition("Sampled (T=0.6,n=8): pass@1 / pass@8")
    assert "| sft | 0.300 ± 0.100 |" in greedy and "| grpo | 0.600 ± 0.000 |" in greedy
    assert "| sft | 0.200 ± 0.100 / 0.600 ± 0.100 |" in sampled
    assert "| grpo |" not in sampled  # no sampled evaluation of that stage
    write_tables([r for r in rows if r["mode"] == "greedy"], tmp_path, "t", "accuracy")
    assert "Sampled" not in (tmp_path / "results.md").read_text()


def test_a_stage_evaluated_in_a_later_run_counts_its_training_time():
    """A stage trained before and evaluated now records only the evaluation's wall time;
    its rows report training plus evaluation (``train_s + eval_s``)."""
    _script()
    from sft_grpo_stages import rows_of

    res = {"eval": {"modes": {"greedy": {"a": {"acc": 0.5}}}}, "wall_s": 30.0}
    assert rows_of("sft", 1, res)[0]["stage_wall_s"] == 30.0
    res |= {"train_s": 500.0, "eval_s": 29.5}
    assert rows_of("sft", 1, res)[0]["stage_wall_s"] == 529.5
