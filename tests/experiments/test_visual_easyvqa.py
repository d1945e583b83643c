"""experiments/visual_easyvqa.py: the summary of finished runs (the runs themselves take
minutes: docs/tasks/visual.md has the command and the results)."""

from __future__ import annotations

import json

from support.experiment_scripts import load_experiment


def _run(path, seed, acc_sft, acc_rl, train_acc):
    args = dict(
        rl_steps=len(train_acc),
        n=4,
        rl_prompts=8,
        rl_lr=3e-4,
        sft_steps=200,
        num_demos=600,
        num_eval=200,
        seed=seed,
    )
    stage = lambda a: {"accuracy": a, "tool_calls_per_question": 1.0, "tool_use_rate": 1.0}
    path.mkdir(parents=True)
    (path / "results.json").write_text(
        json.dumps(
            {
                "args": args,
                "before": stage(0.0),
                "after_sft": stage(acc_sft),
                "after_rl": stage(acc_rl),
                "wall_s": 300.0 + seed,
                "rl": [{"step": i + 1, "train_accuracy": a} for i, a in enumerate(train_acc)],
            }
        )
    )
    return path


def test_summary_averages_the_seeds_of_a_setting(tmp_path):
    mod = load_experiment("visual_easyvqa")
    runs = [
        _run(tmp_path / "s0", 0, 0.3, 0.4, [0.1] * 10 + [0.5] * 10),
        _run(tmp_path / "s1", 1, 0.5, 0.6, [0.3] * 10 + [0.7] * 10),
    ]
    mod.summarize(runs, tmp_path / "out")
    md = (tmp_path / "out" / "results.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| width 64 / vision 32: SFT 200")]
    assert "| 0, 1 | after SFT | 0.400 ± 0.100 | 1.000 ± 0.000 |" in rows[1]
    assert "| 0, 1 | after RL | 0.500 ± 0.100 |" in rows[2]
    assert rows[3].endswith("| 0.200 ± 0.100 | 0.600 ± 0.100 | 300 ± 0 |")
    assert (tmp_path / "out" / "results.png").stat().st_size > 10_000


def test_question_kinds():
    from verltool_jax.tasks.easy_vqa import all_answers, answer_kind

    kinds = {a: answer_kind(a) for a in all_answers()}
    assert [a for a, k in kinds.items() if k == "shape"] == ["circle", "rectangle", "triangle"]
    assert kinds["yes"] == kinds["no"] == "yes/no"
    assert sum(k == "color" for k in kinds.values()) == 8
