"""The sweep mechanism every ablation uses: named arms x seeds through ``launch/local.sh``.

A :class:`Sweep` is a config (``FILE.py[:arg]``), overrides shared by every run, a list
of :class:`Arm` (a name and its own ``--config.a.b=v`` overrides; the first arm is the
baseline) and seeds. Run ``(arm, seed)`` is exactly the cluster launcher's command

    bash launch/local.sh FILE.py ARG -- SHARED... ARM... SEED... --config.trainer.out_dir=DIR

with ``DIR = <root>/<sweep>/<arm>/seed<k>`` and the seed overrides
``trainer.seed = sampler.seed = data.seed = k``. Later overrides win, so an arm may
override a shared setting.

Resumable: a run whose ``summary.json`` exists (and is not marked interrupted) is not
run again; an interrupted one is re-launched with the same command, and the trainer
resumes from its checkpoint. After the runs, :func:`write_report` reads every finished
run directory and writes ``<root>/<sweep>/results.md``, ``results.csv`` and
``sweep.png`` (held-out accuracy and reward vs step and vs wall time, one bold line per arm, the mean of its seeds, the seeds faint).

Use it from an ablation script (``experiments/ablations.py``) or directly:

    python experiments/sweep.py --config configs/tiny_math.py --name lr \\
        --arm lr1e-4 --config.optimizer.lr=1e-4 --arm lr3e-4 --config.optimizer.lr=3e-4
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from verltool_jax.reporting.run_dirs import RunRecord, is_finished, read_run  # noqa: E402
from verltool_jax.reporting.sweep_report import arm_rows, csv_text, markdown_table  # noqa: E402

LAUNCHER = "launch/local.sh"
SEED_FIELDS = ("trainer.seed", "sampler.seed", "data.seed")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class Arm:
    """One setting of the sweep: a name (a directory name) and its config overrides."""

    name: str
    overrides: tuple[str, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(
                f"arm name {self.name!r}: use letters, digits and _.+- "
                f"(it becomes a directory name)"
            )
        bad = [o for o in self.overrides if not (o.startswith("--config.") and "=" in o)]
        if bad:
            raise ValueError(
                f"arm {self.name!r}: overrides must look like --config.a.b=value, got {bad}"
            )


@dataclass(frozen=True)
class Sweep:
    """Arms x seeds over one config (module docstring)."""

    name: str
    config: str  # FILE.py or FILE.py:arg
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...] = (0, 1)
    overrides: tuple[str, ...] = ()  # shared by every run
    root: str = "runs/sweeps"
    question: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"sweep name {self.name!r}: use letters, digits and _.+-")
        if not self.arms:
            raise ValueError(f"sweep {self.name!r} has no arms")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"sweep {self.name!r}: arm names repeat: {names}")
        if not self.seeds:
            raise ValueError(f"sweep {self.name!r}: give at least one seed (--seeds 0,1)")
        bad = [o for o in self.overrides if not (o.startswith("--config.") and "=" in o)]
        if bad:
            raise ValueError(
                f"sweep {self.name!r}: shared overrides must look like "
                f"--config.a.b=value, got {bad}"
            )

    @property
    def directory(self) -> Path:
        return Path(self.root) / self.name

    def run_dir(self, arm: Arm, seed: int) -> Path:
        return self.directory / arm.name / f"seed{seed}"

    def command(self, arm: Arm, seed: int) -> list[str]:
        """The launcher command of run ``(arm, seed)`` (relative to the repository root)."""
        file, _, arg = self.config.partition(":")
        seed_overrides = [f"--config.{f}={seed}" for f in SEED_FIELDS]
        return [
            "bash",
            LAUNCHER,
            file,
            arg,
            "--",
            *self.overrides,
            *arm.overrides,
            *seed_overrides,
            f"--config.trainer.out_dir={self.run_dir(arm, seed)}",
        ]

    def runs(self) -> list[tuple[Arm, int]]:
        return [(a, s) for a in self.arms for s in self.seeds]


def run_sweep(
    sweep: Sweep,
    cwd: Path = REPO,
    dry_run: bool = False,
    runner: Callable[[list[str], Path], int] | None = None,
    say: Callable[[str], None] = print,
) -> list[tuple[Arm, int, str]]:
    """Run every unfinished ``(arm, seed)`` in order; returns ``(arm, seed, status)`` with
    status ``"done"`` (already finished: skipped), ``"ran"``, ``"failed rc=N"`` or
    ``"dry-run"``. A failed run does not stop the others. ``runner(cmd, cwd) -> rc``
    defaults to ``subprocess.run``."""

    def default_runner(cmd: list[str], where: Path) -> int:
        return subprocess.run(cmd, cwd=where).returncode

    runner = runner or default_runner
    out = []
    for arm, seed in sweep.runs():
        d = Path(cwd) / sweep.run_dir(arm, seed)
        if is_finished(d):
            say(f"[sweep] {sweep.name}/{arm.name}/seed{seed}: finished, skipped ({d})")
            out.append((arm, seed, "done"))
            continue
        cmd = sweep.command(arm, seed)
        say(
            f"[sweep] {sweep.name}/{arm.name}/seed{seed}: "
            + " ".join(c if c else '""' for c in cmd)
        )
        if dry_run:
            out.append((arm, seed, "dry-run"))
            continue
        t0 = time.perf_counter()
        rc = runner(cmd, Path(cwd))
        status = "ran" if rc == 0 and is_finished(d) else f"failed rc={rc}"
        say(
            f"[sweep] {sweep.name}/{arm.name}/seed{seed}: {status} in "
            f"{time.perf_counter() - t0:.0f}s"
        )
        out.append((arm, seed, status))
    return out


def collect(sweep: Sweep, cwd: Path = REPO) -> dict[str, list[RunRecord]]:
    """``{arm: [RunRecord of each finished seed]}`` in arm order (unfinished seeds left out)."""
    return {
        arm.name: [
            read_run(Path(cwd) / sweep.run_dir(arm, s))
            for s in sweep.seeds
            if is_finished(Path(cwd) / sweep.run_dir(arm, s))
        ]
        for arm in sweep.arms
    }


def report_header(sweep: Sweep, runs: dict[str, list[RunRecord]]) -> str:
    """What ran: config, shared overrides, each arm's overrides and finished seeds."""
    lines = [f"# Sweep `{sweep.name}`", ""]
    if sweep.question:
        lines += [sweep.question, ""]
    lines += [
        f"- config: `{sweep.config}`",
        f"- shared overrides: `{' '.join(sweep.overrides) or '(none)'}`",
        f"- seeds: {', '.join(map(str, sweep.seeds))} (each sets {', '.join(SEED_FIELDS)})",
        "- arms (the first is the baseline):",
    ]
    for arm in sweep.arms:
        done = [r.path.name for r in runs.get(arm.name, [])]
        lines.append(
            f"  - `{arm.name}`: `{' '.join(arm.overrides) or '(config as is)'}`"
            + (f" ({arm.note})" if arm.note else "")
            + f"; finished: {', '.join(done) or 'none'}"
        )
    lines += [
        "",
        "Cells are mean ± sample standard deviation over the finished seeds; **bold**: "
        "the arm differs from the baseline by more than the two spreads added "
        "(|mean_a - mean_b| > sd_a + sd_b). Reward: mean over the last half of the RL "
        "steps; tokens/s: mean over the RL steps; dropped groups: groups discarded as "
        "too stale; wall: the whole run (SFT warm start, evaluations and RL).",
        "",
    ]
    return "\n".join(lines)


def write_report(sweep: Sweep, cwd: Path = REPO) -> dict[str, Path]:
    """Write ``results.md``, ``results.csv`` and ``sweep.png`` into the sweep directory
    from the finished run directories; returns their paths (no plot if nothing to plot).
    ValueError if no run has finished."""
    from verltool_jax.reporting.plots import plot_sweep

    runs = collect(sweep, cwd)
    runs = {a: r for a, r in runs.items() if r}
    if not runs:
        raise ValueError(
            f"sweep {sweep.name!r}: no finished run under "
            f"{Path(cwd) / sweep.directory}; run it first"
        )
    rows = arm_rows(runs)
    d = Path(cwd) / sweep.directory
    d.mkdir(parents=True, exist_ok=True)
    paths = {"md": d / "results.md", "csv": d / "results.csv"}
    table = markdown_table(rows)
    paths["md"].write_text(report_header(sweep, runs) + "\n" + table + "\n![sweep](sweep.png)\n")
    paths["csv"].write_text(csv_text(rows))
    try:
        paths["png"] = plot_sweep(
            runs, d / "sweep.png", title=f"sweep {sweep.name}: {sweep.config}"
        )
    except ValueError as e:
        print(f"[sweep] no plot: {e}")
    return paths


def failure_lines(sweep: Sweep, failed: Sequence[tuple[Arm, int]], cwd: Path = REPO) -> list[str]:
    """One line per failed run: its console log and that log's last line (the error)."""
    lines = []
    for arm, seed in failed:
        log = Path(cwd) / sweep.run_dir(arm, seed) / "console.log"
        tail = (
            [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
            if log.is_file()
            else []
        )
        lines.append(
            f"  {arm.name}/seed{seed}: {log}" + (f": {tail[-1].strip()}" if tail else " (no log)")
        )
    return lines


def main_for(
    sweep: Sweep,
    dry_run: bool = False,
    report_only: bool = False,
    cwd: Path = REPO,
    runner: Callable[[list[str], Path], int] | None = None,
) -> int:
    """Run (unless ``report_only``) and report; prints the table. Exit code 1 if any run
    failed (each named with its log's last line), also when none finished."""
    statuses = [] if report_only else run_sweep(sweep, cwd=cwd, dry_run=dry_run, runner=runner)
    if dry_run:
        return 0
    failed = [(a, s) for a, s, st in statuses if st.startswith("failed")]
    try:
        paths = write_report(sweep, cwd)
    except ValueError as e:
        if not failed:
            raise
        print(f"[sweep] no report: {e}")
    else:
        print(paths["md"].read_text())
        print("[sweep] wrote " + ", ".join(str(p) for p in paths.values()))
    if failed:
        print(f"[sweep] {len(failed)} run(s) failed; the same command retries them:")
        print("\n".join(failure_lines(sweep, failed, cwd)))
        return 1
    return 0


def add_common_args(ap: argparse.ArgumentParser, default_config: str) -> None:
    """The flags every sweep script takes."""
    ap.add_argument(
        "--config", default=default_config, help="config FILE.py[:arg] (default %(default)s)"
    )
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    ap.add_argument("--root", default="runs/sweeps", help="sweep directories go here")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="only rebuild the table and plot from the finished runs",
    )


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise SystemExit(f"--seeds {text!r}: give comma-separated integers, e.g. 0,1") from None
    if not seeds:
        raise SystemExit("--seeds: give at least one seed, e.g. 0,1")
    return seeds


def split_arms(tokens: Sequence[str]) -> tuple[list[str], list[Arm]]:
    """``[--config.x=1, --arm, a, --config.y=2, --arm, b, ...]`` -> (shared overrides
    before the first ``--arm``, arms with the overrides that follow each)."""
    shared: list[str] = []
    arms: list[tuple[str, list[str]]] = []
    it = iter(tokens)
    for tok in it:
        if tok == "--arm" or tok.startswith("--arm="):
            name = tok.partition("=")[2] if "=" in tok else next(it, "")
            arms.append((name, []))
        elif arms:
            arms[-1][1].append(tok)
        else:
            shared.append(tok)
    return shared, [Arm(n, tuple(o)) for n, o in arms]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, "configs/tiny_math.py")
    ap.add_argument("--name", required=True, help="the sweep's name (its directory)")
    args, rest = ap.parse_known_args(argv)
    shared, arms = split_arms(rest)
    if not arms:
        ap.error("give at least one --arm NAME followed by its --config.a.b=v overrides")
    sweep = Sweep(
        args.name, args.config, tuple(arms), parse_seeds(args.seeds), tuple(shared), args.root
    )
    return main_for(sweep, args.dry_run, args.report_only)


if __name__ == "__main__":
    sys.exit(main())
