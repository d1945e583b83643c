"""The staged real-model experiment shared by ``math_smollm2.py`` and ``search_smollm2.py``:
held-out metrics of a model before training, after an SFT warm start and after GRPO from
it, per seed, resumable stage by stage.

Stages (a :class:`Recipe` names the config file; ``--smoke`` uses its ``:tiny`` variant):

1. ``base``: the untrained model (``model.path``, greedy, once: it has no seed);
2. ``sft`` per seed: the SFT warm start alone (``stage=sft``) on the task's
   demonstrations, exported as an HF checkpoint, then evaluated;
3. ``grpo`` per seed: GRPO from that checkpoint (``model.path`` = the SFT export,
   ``sft.steps=0``), with the task's tools, exported and evaluated.

Evaluation is ``verltool_jax.eval.run_eval`` on the task's held-out sets, one table row
per (stage, seed, test set); ``acc`` is the task's correctness (accuracy, exact match,
execution match). The training runs evaluate nothing themselves
(``data.max_eval_examples=0``), so every evaluation happens once, here.

They run per seed (sft, grpo), then base; ``--stages grpo,base`` runs only those (a stage
not named is read back if done). Resumable: each finished stage leaves
``<out>/<stage>[_seed<s>].json`` (metrics and wall time) and is not run again; an
interrupted training run (a signal) records nothing, stops the experiment, and resumes
from its own checkpoint next time. Outputs under ``--out``: ``results.csv``,
``results.md`` (mean and spread over seeds), ``accuracy.png`` and ``experiment.json``
(for ``experiments/reproduce.py``); each evaluation's trajectories, every turn with its
tool call, observation and reward, in ``base/trajectories.html``,
``sft_seed<s>/eval/trajectories.html`` and ``grpo_seed<s>/eval/trajectories.html``.
``--set key=value`` overrides any config key in every stage.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STAGES = ("base", "sft", "grpo")
Overrides = list[tuple[str, str]]


@dataclass(frozen=True)
class Recipe:
    """What differs between experiments: the config, the data, the words."""

    name: str  # log prefix and experiment.json's "experiment"
    config_file: str  # relative to the repository, e.g. "configs/vt_math.py"
    title: str  # plot title of the real run
    metric: str  # what "acc" means here, e.g. "accuracy", "exact match"
    data_help: str  # --data-dir help
    # data_dir -> an error message, or None when the data are there
    check_data: Callable[[str], str | None]
    # (data_dir, out, smoke) -> the overrides that point the config at the data; may
    # prepare things once under out (an index), printing what it does
    data_overrides: Callable[[str, Path, bool], Overrides]
    # overrides of the GRPO stage only (e.g. a curriculum, evaluation during training)
    grpo_overrides: Overrides = ()


def stage_config(
    recipe: Recipe,
    variant: str,
    data: Overrides,
    out: Path,
    overrides: Sequence[tuple[str, str]],
    *,
    smoke: bool,
):
    """The recipe's config of ``variant`` with the data overrides, the run dir ``out``
    and ``overrides`` applied (validated)."""
    from verltool_jax.cli import apply_overrides, load_config, validate_config

    c = load_config(str(REPO / recipe.config_file) + f":{variant}")
    base = list(data) + [("trainer.out_dir", str(out)), ("logging.progress_bar", "false")]
    if smoke:
        base += [("sampler.backend", "jax")]
    apply_overrides(c, base + list(overrides))
    validate_config(c)
    return c


class StageInterrupted(RuntimeError):
    """A training stage stopped before its last step (a signal, Ctrl-C)."""


def stage_done(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def run_stage(prefix: str, name: str, result_path: Path, fn) -> dict:
    """Run ``fn() -> dict`` unless ``result_path`` holds its result; records wall time."""
    done = stage_done(result_path)
    if done is not None:
        print(f"[{prefix}] {name}: done before ({done['wall_s']:.0f}s), skipped", flush=True)
        return done
    print(f"[{prefix}] {name}: running", flush=True)
    t0 = time.perf_counter()
    res = fn()
    res["wall_s"] = time.perf_counter() - t0
    result_path.write_text(json.dumps(res, indent=2))
    print(f"[{prefix}] {name}: wall time {res['wall_s']:.1f}s", flush=True)
    return res


def stage_wall_s(res: dict) -> float:
    """A stage's training plus evaluation seconds: ``train_s + eval_s`` where the result
    has both (a stage trained in an earlier run and evaluated in this one counts its
    training too), else the wall time its run recorded."""
    if "train_s" in res and "eval_s" in res:
        return float(res["train_s"]) + float(res["eval_s"])
    return float(res["wall_s"])


def rows_of(stage: str, seed: Any, res: dict) -> list[dict]:
    """One row per (mode, test set) of a stage's evaluation; the greedy rows also carry
    the task's own metrics (retrieval QA per set: ``em``, ``f1``, ``searches``, ...;
    text-to-SQL, one set: ``sql_exec_acc_<level>``, ``sql_calls_per_question``, ...)."""
    out = []
    extra = dict(res["eval"].get("search") or {})
    sql = res["eval"].get("sql")
    greedy_sets = list(res["eval"]["modes"].get("greedy", {}))
    if sql and len(greedy_sets) == 1:
        extra[greedy_sets[0]] = {k.replace("/", "_"): v for k, v in sql.items()}
    for mode, sets in res["eval"]["modes"].items():
        for name, m in sets.items():
            more = extra.get(name, {}) if mode == "greedy" else {}
            cells = {**m, **{k: v for k, v in more.items() if k != "n"}}
            out.append(
                {
                    "stage": stage,
                    "seed": seed,
                    "mode": mode,
                    "set": name,
                    **{k: round(v, 4) if isinstance(v, float) else v for k, v in cells.items()},
                    "stage_wall_s": round(stage_wall_s(res), 1),
                }
            )
    return out


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half the range) of ``values``: the spread the tables report over seeds."""
    import numpy as np

    return float(np.mean(values)), (max(values) - min(values)) / 2


def sampled_tables(rows: list[dict], stages: Sequence[str]) -> str:
    """Markdown for each sampled evaluation mode (``T=<t>,n=<k>``) in ``rows``: per stage
    and set, ``pass@1 / pass@k`` (pass@1: the mean over the k samples) as mean ± half the
    spread over seeds; empty when every row is greedy."""
    out = []
    for mode in sorted({r["mode"] for r in rows} - {"greedy"}):
        mrows = [r for r in rows if r["mode"] == mode]
        k = mode.rpartition("n=")[2]
        sets = sorted({r["set"] for r in mrows})
        cells_of: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in mrows:
            cells_of.setdefault((r["stage"], r["set"]), []).append(
                (float(r["acc"]), float(r.get(f"pass@{k}", float("nan"))))
            )
        md = ["| stage | " + " | ".join(sets) + " |", "|---" * (len(sets) + 1) + "|"]
        for s in stages:
            cells = []
            for name in sets:
                v = cells_of.get((s, name))
                if not v:
                    cells.append("-")
                    continue
                p1, pk = spread([a for a, _ in v]), spread([b for _, b in v])
                cells.append(f"{p1[0]:.3f} ± {p1[1]:.3f} / {pk[0]:.3f} ± {pk[1]:.3f}")
            if any(c != "-" for c in cells):
                md.append(f"| {s} | " + " | ".join(cells) + " |")
        out.append(
            f"\nSampled ({mode}): pass@1 / pass@{k} per test set (mean ± half the spread "
            "over seeds).\n\n" + "\n".join(md) + "\n"
        )
    return "".join(out)


def write_tables(rows: list[dict], out: Path, title: str, metric: str) -> None:
    """``results.csv`` (every row), ``results.md`` (``acc`` mean ± half-range over seeds
    per stage and set, greedy; then each sampled mode's pass@1 / pass@k,
    :func:`sampled_tables`) and ``accuracy.png``."""
    import numpy as np

    keys = sorted(
        {k for r in rows for k in r}, key=lambda k: (k not in ("stage", "seed", "mode", "set"), k)
    )
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    greedy = [r for r in rows if r["mode"] == "greedy"]
    sets = sorted({r["set"] for r in greedy})
    stages = [s for s in STAGES if any(r["stage"] == s for r in greedy)]
    table: dict[tuple[str, str], list[float]] = {}
    for r in greedy:
        table.setdefault((r["stage"], r["set"]), []).append(r["acc"])
    md = ["| stage | " + " | ".join(sets) + " | seeds | wall s |", "|---" * (len(sets) + 3) + "|"]
    for s in stages:
        cells = []
        for name in sets:
            v = table.get((s, name), [])
            cells.append("{:.3f} ± {:.3f}".format(*spread(v)) if v else "-")
        wall = [
            w
            for _, w in sorted(
                {str(r["seed"]): r["stage_wall_s"] for r in greedy if r["stage"] == s}.items()
            )
        ]
        seeds = sorted({str(r["seed"]) for r in greedy if r["stage"] == s})
        md.append(
            f"| {s} | " + " | ".join(cells) + f" | {','.join(seeds)} | "
            f"{'/'.join(f'{x:.0f}' for x in wall)} |"
        )
    (out / "results.md").write_text(
        f"Greedy {metric} per test set (mean ± half the spread over seeds); wall s per "
        "seed (training + evaluation).\n\n" + "\n".join(md) + "\n" + sampled_tables(rows, stages)
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(len(stages))
    for j, name in enumerate(sets):
        means = [np.mean(table.get((s, name), [np.nan])) for s in stages]
        lo = [means[i] - np.min(table.get((s, name), [np.nan])) for i, s in enumerate(stages)]
        hi = [np.max(table.get((s, name), [np.nan])) - means[i] for i, s in enumerate(stages)]
        ax.errorbar(x + 0.05 * j, means, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.set_xticks(x, stages)
    ax.set_ylabel(f"greedy {metric}")
    ax.set_title(title)
    top = max([r["acc"] for r in greedy] + [0.05])
    ax.set_ylim(0.0, min(1.0, top * 1.15) + 0.01)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=120)
    plt.close(fig)


def write_experiment_summary(recipe: Recipe, rows: list[dict], out: Path, config, seeds) -> None:
    """``experiment.json``: the GRPO stage's config and a one-paragraph result (greedy
    ``acc`` per set and stage, mean ± half-range over seeds, wall time), which
    ``experiments/reproduce.py`` puts in the reproduction table."""
    greedy = [r for r in rows if r["mode"] == "greedy"]
    parts = []
    for name in sorted({r["set"] for r in greedy}):
        cells = []
        for stage in STAGES:
            v = [r["acc"] for r in greedy if r["stage"] == stage and r["set"] == name]
            if v:
                mean, half = spread(v)
                cells.append(
                    f"{stage} {100 * mean:.1f}%" + (f" ± {100 * half:.1f}" if len(v) > 1 else "")
                )
        n = next(r["problems"] for r in greedy if r["set"] == name)
        parts.append(f"{name} ({n} problems): " + ", ".join(cells))
    wall = sum({(r["stage"], str(r["seed"])): r["stage_wall_s"] for r in greedy}.values())
    summary = (
        f"SmolLM2-135M-Instruct, greedy {recipe.metric} base -> SFT -> GRPO (mean ± "
        f"half the spread over seeds {','.join(map(str, seeds))}): "
        + "; ".join(parts)
        + f"; {wall / 60:.0f} min of training and evaluation on 2 CPU cores"
    )
    (out / "experiment.json").write_text(
        json.dumps(
            {"experiment": recipe.name, "config": config.to_dict(), "summary": summary},
            indent=2,
            default=str,
        )
    )


def main(recipe: Recipe, argv: Sequence[str] | None = None, doc: str = "") -> int:
    ap = argparse.ArgumentParser(description=(doc or __doc__).split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, help=recipe.data_help)
    ap.add_argument("--out", default=f"runs/{recipe.name}")
    ap.add_argument("--seeds", default="1,2", help="comma-separated training seeds")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help=f"{recipe.config_file}:tiny (a tiny random model, seconds)",
    )
    ap.add_argument(
        "--samples",
        type=int,
        default=0,
        help="also evaluate N samples per problem at --temperature (pass@1 mean, pass@N)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the --samples evaluation (default 1)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every stage (repeatable)",
    )
    ap.add_argument(
        "--filter",
        default="",
        metavar="K[,LO,HI]",
        help="before GRPO, measure each training prompt's pass rate under the SFT model "
        "(K samples, python -m verltool_jax.passrate) and train GRPO only on the prompts "
        "with LO < rate < HI (default 0,1)",
    )
    ap.add_argument(
        "--filter-limit",
        type=int,
        default=0,
        help="measure at most N prompts of the training pool (0: all)",
    )
    ap.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="comma-separated stages to run now (default: all); the tables "
        "include every stage already done",
    )
    a = ap.parse_args(argv)
    wanted = [x.strip() for x in a.stages.split(",") if x.strip()]
    if not wanted or set(wanted) - set(STAGES):
        ap.error(f"--stages={a.stages!r}: give a comma-separated subset of {','.join(STAGES)}")
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds={a.seeds!r}: give comma-separated integers, e.g. 1,2")
    if not seeds:
        ap.error("--seeds: give at least one seed")
    if a.samples < 0:
        ap.error("--samples must be >= 0")
    filt = parse_filter(a.filter) if a.filter else None
    if a.filter and filt is None:
        ap.error(f"--filter={a.filter!r}: give K or K,LO,HI, e.g. 8 or 8,0,1")
    overrides = []
    for kv in a.set:
        if "=" not in kv:
            ap.error(f"--set {kv!r}: give KEY=VALUE, e.g. trainer.steps=20")
        overrides.append(tuple(kv.split("=", 1)))
    problem = recipe.check_data(a.data_dir)
    if problem:
        ap.error(f"--data-dir {a.data_dir}: {problem}")

    from verltool_jax.eval import run_eval
    from verltool_jax.run_config import run_config_from_dict
    from verltool_jax.runtime.console import library_output_to, run_logged
    from verltool_jax.train import build
    from verltool_jax.train.trainer import train

    prefix = recipe.name
    variant = "tiny" if a.smoke else "smol"
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = recipe.data_overrides(str(Path(a.data_dir).resolve()), out, a.smoke)
    t_all = time.perf_counter()

    def config(run_dir: Path, more: Overrides):
        return stage_config(recipe, variant, data, run_dir, overrides + more, smoke=a.smoke)

    # One starting model for every stage (the tiny variant builds it once here).
    model_dir = build.prepare_model_dir(
        run_config_from_dict(config(out / "base", [])), out / "base"
    )
    overrides = [("model.path", str(model_dir))] + overrides

    def evaluate(run_dir: Path, checkpoint: str, seed: int) -> dict:
        c = config(run_dir, [("sampler.seed", str(seed))])
        with library_output_to(run_dir / "run.log"):  # vLLM's and XLA's lines
            return run_eval(
                c,
                checkpoint,
                samples=a.samples,
                temperature=a.temperature,
                report=str(run_dir / "trajectories.html"),
            )

    def training(stage: str, seed: int, extra: Overrides):
        run_dir = out / f"{stage}_seed{seed}"

        def go() -> dict:
            c = config(
                run_dir,
                [
                    ("trainer.seed", str(seed)),
                    ("data.seed", str(seed)),
                    ("sampler.seed", str(seed)),
                    ("data.max_eval_examples", "0"),
                    ("checkpoint.export_hf", "true"),
                ]
                + extra,
            )
            done = run_dir / "summary.json"
            if (
                done.is_file()
                and (run_dir / "hf_model").is_dir()
                and not json.loads(done.read_text()).get("interrupted")
            ):
                # trained before, interrupted while evaluating: evaluate only
                summary = json.loads(done.read_text())
                train_s = float(summary.get("wall_s", 0.0))
                print(
                    f"[{prefix}] {stage} seed {seed}: trained before ({train_s:.0f}s), evaluating",
                    flush=True,
                )
            else:
                t0 = time.perf_counter()
                summary = run_logged(c, lambda: train(c)).summary.to_json()
                train_s = time.perf_counter() - t0
                if summary.get("interrupted"):
                    # a stopped run is not a result: nothing is recorded or evaluated, and
                    # the same command resumes it from its checkpoint
                    raise StageInterrupted(
                        f"{stage} seed {seed} was interrupted at step "
                        f"{summary.get('steps')}; run the same command "
                        f"to resume it"
                    )
            t0 = time.perf_counter()
            res = evaluate(run_dir / "eval", str(run_dir / "hf_model"), seed)
            return {
                "train": {
                    k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))
                },
                "train_s": train_s,
                "eval_s": time.perf_counter() - t0,
                "eval": res,
            }

        return run_stage(prefix, f"{stage} seed {seed}", out / f"{stage}_seed{seed}.json", go)

    def filter_pool(seed: int, sft_model: Path, pool: Path) -> dict:
        """The pass rates of the training pool under the SFT model; writes the pool."""
        from verltool_jax.passrate import measure, summary

        k, lo, hi = filt
        run_dir = pool.parent
        c = config(
            run_dir,
            [
                ("sampler.seed", str(seed)),
                ("data.seed", str(seed)),
                ("model.path", str(sft_model)),
                ("sft.steps", "0"),
            ],
        )
        with library_output_to(run_dir / "run.log"):
            rates = measure(
                c, "base", run_dir, k, limit=a.filter_limit, write_pool=str(pool), bounds=(lo, hi)
            )
        kept = sum(lo < r.rate < hi for r in rates)
        return {"summary": summary(rates), "kept": kept, "bounds": [lo, hi]}

    filters: dict[int, dict | None] = {}

    def stage(name: str, result_path: Path, run):
        """Run a wanted stage (or read its result); an unwanted one only if done."""
        if name in wanted:
            return run()
        return stage_done(result_path)

    rows: list[dict] = []
    try:
        for seed in seeds:
            res = stage(
                "sft",
                out / f"sft_seed{seed}.json",
                lambda seed=seed: training("sft", seed, [("stage", "sft")]),
            )
            rows += rows_of("sft", seed, res) if res else []
            sft_model = out / f"sft_seed{seed}" / "hf_model"
            if (
                "grpo" in wanted
                and not (out / f"grpo_seed{seed}.json").is_file()
                and not sft_model.is_dir()
            ):
                ap.error(
                    f"grpo seed {seed} starts from the SFT export {sft_model}, which "
                    f"does not exist: run --stages sft (or all) first"
                )
            pool_overrides: Overrides = []
            if filt is not None:
                pool = out / f"filter_seed{seed}" / "pool.parquet"
                res = stage(
                    "grpo",
                    out / f"filter_seed{seed}.json",
                    lambda seed=seed, sft_model=sft_model, pool=pool: run_stage(
                        prefix,
                        f"filter seed {seed}",
                        out / f"filter_seed{seed}.json",
                        lambda: filter_pool(seed, sft_model, pool),
                    ),
                )
                filters[seed] = res
                pool_overrides = [("data.train_files", str(pool))]
            res = stage(
                "grpo",
                out / f"grpo_seed{seed}.json",
                lambda seed=seed, sft_model=sft_model, more=pool_overrides: training(
                    "grpo",
                    seed,
                    [("stage", "rl"), ("sft.steps", "0"), ("model.path", str(sft_model))]
                    + more
                    + list(recipe.grpo_overrides),
                ),
            )
            rows += rows_of("grpo", seed, res) if res else []
        res = stage(
            "base",
            out / "base.json",
            lambda: run_stage(
                prefix,
                "base",
                out / "base.json",
                lambda: {"eval": evaluate(out / "base", "base", seeds[0])},
            ),
        )
        rows = (rows_of("base", "-", res) if res else []) + rows
    except StageInterrupted as e:
        print(f"[{prefix}] {e}", flush=True)
        return 130
    if not rows:
        print(f"[{prefix}] no stage has a result yet", flush=True)
        return 1
    write_tables(
        rows,
        out,
        f"{recipe.config_file}:tiny smoke run (random tiny model)" if a.smoke else recipe.title,
        recipe.metric,
    )
    write_experiment_summary(recipe, rows, out, config(out / "grpo_summary", []), seeds)
    if any(filters.values()):
        write_filter_table(filters, out)
    write_training_curves(out, seeds)
    print((out / "results.md").read_text())
    print(
        f"[{prefix}] all stages: {time.perf_counter() - t_all:.0f}s; "
        f"results in {out}/results.{{csv,md}} and accuracy.png",
        flush=True,
    )
    return 0


def parse_filter(text: str) -> tuple[int, float, float] | None:
    """``--filter K[,LO,HI]`` -> (K, LO, HI) (LO, HI default 0, 1); None if malformed."""
    parts = text.split(",")
    try:
        k = int(parts[0])
        lo, hi = (float(parts[1]), float(parts[2])) if len(parts) == 3 else (0.0, 1.0)
    except (ValueError, IndexError):
        return None
    if k < 1 or len(parts) not in (1, 3) or not 0.0 <= lo < hi <= 1.0:
        return None
    return k, lo, hi


def write_filter_table(filters: dict, out: Path) -> None:
    """``filter.md``: per seed, the pool's pass-rate histogram under the SFT model and how
    many prompts GRPO kept."""
    lines = [
        "| seed | prompts | pass@1 | pass@k | successes of k (histogram) | kept | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed, res in sorted(filters.items()):
        if not res:
            continue
        s = res["summary"]
        k = s["k"]
        hist = " ".join(f"{c}:{n}" for c, n in s["histogram"].items())
        lines.append(
            f"| {seed} | {s['prompts']} | {s['pass@1']:.3f} | {s[f'pass@{k}']:.3f} "
            f"(k={k}) | {hist} | {res['kept']} | {res['wall_s']:.0f} |"
        )
    (out / "filter.md").write_text(
        "Pass rates of the training pool under each seed's SFT model (python -m "
        "verltool_jax.passrate); GRPO trains on the kept prompts (rate strictly between "
        "the bounds).\n\n" + "\n".join(lines) + "\n"
    )


def write_training_curves(out: Path, seeds: Sequence[int]) -> Path | None:
    """``training.png``: per GRPO seed, per step: train reward, held-out accuracy (when
    the run evaluated during training), the fraction of groups without signal, and the
    mean curriculum level over the datasets (with a curriculum)."""
    from verltool_jax.reporting.metrics_writer import read_metrics
    from verltool_jax.reporting.plots import series

    runs = {s: out / f"grpo_seed{s}" / "metrics.jsonl" for s in seeds}
    runs = {s: read_metrics(p) for s, p in runs.items() if p.is_file()}
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def level(recs):
        xs, ys = [], []
        for r in recs:
            lv = [v for k, v in r.items() if k.startswith("curriculum/") and k.endswith("/level")]
            if lv:
                xs.append(int(r["step"]))
                ys.append(sum(lv) / len(lv))
        return xs, ys

    panels = [
        ("train reward", lambda recs: series(recs, "reward/mean")),
        ("held-out accuracy", lambda recs: series(recs, "eval/acc")),
        ("groups without signal", lambda recs: series(recs, "signal/no_signal_frac")),
        ("mean difficulty level", level),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (label, get) in zip(axes, panels):
        for s, recs in sorted(runs.items()):
            xs, ys = get(recs)
            if xs:
                ax.plot(
                    xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=f"seed {s}"
                )
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "training.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_script(recipe: Recipe, doc: str) -> None:
    """An experiment script's ``__main__``: glibc malloc tuned for XLA's buffers
    (``verltool_jax.runtime.malloc_tuning``: huge pages, freed memory kept), then
    :func:`main` on the command line, its return value the exit status."""
    import sys

    from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()
    sys.exit(main(recipe, None, doc))
