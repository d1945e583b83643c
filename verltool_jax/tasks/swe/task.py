"""The ``quixbugs`` task: rows, its config section, preparation from a run config and
the command line."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from verltool_jax.data.readers import write_rows
from verltool_jax.tasks import TaskFiles
from verltool_jax.tasks.swe.quixbugs import quixbugs_tasks
from verltool_jax.tasks.swe.swebench import swebench_tasks
from verltool_jax.tasks.swe.testing import (
    DATA_SOURCE,
    SweTask,
)

# ----------------------------------------------------------------------------- rows

TOOLS_TEXT = (
    "You are working in a repository (the current directory). Tools, one call per turn:\n"
    "- a shell: <bash>COMMAND</bash> (the shell keeps its directory and variables);\n"
    '- the file editor: <tool_call>{"name": "file_editor", "arguments": {"command": '
    '"view" | "create" | "str_replace" | "insert", "path": "...", ...}}</tool_call> '
    '(str_replace takes "old_str" and "new_str");\n'
    '- the tests: <tool_call>{"name": "run_tests", "arguments": {}}</tool_call>.\n'
    "When you are done, answer with <answer>done</answer>."
)


def make_row(task: SweTask, split: str = "eval", index: int = 0) -> dict:
    """One verl-layout row: the statement as the prompt, the test commands and the
    workspace source in ``extra_info`` (what the tool server gets)."""
    return {
        "prompt": [
            {"role": "system", "content": TOOLS_TEXT},
            {"role": "user", "content": task.statement},
        ],
        "data_source": DATA_SOURCE,
        "ability": "swe",
        "reward_model": {
            "style": "rule",
            "ground_truth": {
                "fail_to_pass": list(task.fail_to_pass),
                "pass_to_pass": list(task.pass_to_pass),
            },
        },
        "extra_info": {
            "task_id": task.task_id,
            "repo_path": task.repo_path,
            "test_cmd": task.test_cmd,
            "hidden_test_cmd": task.hidden_test_cmd,
            "source": task.source,
            "split": split,
            "index": index,
        },
    }


@dataclass(frozen=True)
class QuixBugsTask:
    """The ``task`` config section of the SWE family on QuixBugs (``configs/vt_swe.py``)."""

    name: str = "quixbugs"
    quixbugs_dir: str = ""  # required: the QuixBugs folder
    programs: tuple[str, ...] = ()  # empty: all 40 programs with pytest files
    mutants_per_program: int = 3  # train tasks per program
    seed: int = 0


TASK_CONFIG = QuixBugsTask


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """QuixBugs tasks from ``config.task.quixbugs_dir`` (``programs`` if non-empty;
    ``mutants_per_program`` mutants each): eval rows = the original bugs, train rows =
    the mutants (or the original bugs when there are none)."""
    t = config.task
    if not t.quixbugs_dir:
        raise ValueError(
            "task.quixbugs_dir is empty: pass the QuixBugs folder "
            "(python_programs/, correct_python_programs/, python_testcases/), "
            "e.g. --config.task.quixbugs_dir=/data/quixbugs"
        )
    out = Path(out_dir)
    tasks, rejected = quixbugs_tasks(
        t.quixbugs_dir, out, tuple(t.programs) or None, int(t.mutants_per_program), int(t.seed)
    )
    originals = [x for x in tasks if x.source == "quixbugs"]
    mutated = [x for x in tasks if x.source != "quixbugs"] or originals
    if not originals:
        raise ValueError("no usable QuixBugs task:\n" + "\n".join(rejected))
    (out / "rejected.txt").write_text("\n".join(rejected) + "\n")
    return TaskFiles(
        train=write_rows(
            [make_row(x, "train", i) for i, x in enumerate(mutated)], out / "train.parquet"
        ),
        eval=write_rows(
            [make_row(x, "eval", i) for i, x in enumerate(originals)], out / "eval.parquet"
        ),
    )


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="SWE tasks: repository snapshots with a statement and a hidden test command"
    )
    ap.add_argument("--quixbugs-dir", default="")
    ap.add_argument("--swebench-jsonl", default="")
    ap.add_argument("--mirrors", default="", help="folder of local git mirrors (SWE-bench)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--programs", default="", help="comma-separated QuixBugs programs")
    ap.add_argument("--mutants", type=int, default=0, help="mutant tasks per program")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(None if argv is None else list(argv))
    t0 = time.perf_counter()
    tasks, rejected = [], []
    if args.quixbugs_dir:
        progs = [p for p in args.programs.split(",") if p] or None
        t, r = quixbugs_tasks(args.quixbugs_dir, args.out, progs, args.mutants, args.seed)
        tasks += t
        rejected += r
    if args.swebench_jsonl:
        if not args.mirrors:
            ap.error("--swebench-jsonl needs --mirrors")
        t, r = swebench_tasks(args.swebench_jsonl, args.mirrors, args.out)
        tasks += t
        rejected += r
    if not tasks:
        print("no task written", *rejected, sep="\n")
        return 1
    rows = [make_row(x, "eval", i) for i, x in enumerate(tasks)]
    path = write_rows(rows, Path(args.out) / "tasks.parquet")
    by_source: dict[str, int] = {}
    for x in tasks:
        by_source[x.source] = by_source.get(x.source, 0) + 1
    print(f"tasks: {len(tasks)} {by_source} -> {path}")
    for r in rejected:
        print(f"  rejected: {r}")
    print(f"time: {time.perf_counter() - t0:.1f}s")
    return 0
