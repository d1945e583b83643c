"""What a run leaves at its end: :class:`RunSummary` (``summary.json`` and the last
console line, written by :func:`finish` on every way out of ``trainer.train``) and the
reports (:func:`finish_reports`: the metrics plot and the page of sample trajectories)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verltool_jax.reporting.html_report import write_trajectory_report
from verltool_jax.reporting.plots import plot_metrics
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.train import multihost

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """The outcome of one ``train`` call, as ``summary.json`` holds it.

    ``eval_before`` / ``eval_after``: held-out accuracy at the start (or after the SFT
    warm start) and at the end (None without a held-out set, or when interrupted);
    ``steps``: the policy version reached; ``interrupted``: stopped by a signal (exit 130);
    ``sft_interrupted``: stopped during the SFT warm start (nothing saved); ``data``: the
    data accounting (``rollout.ledger.Accounting.to_json``, summed over the run and its
    resumed parts; None when no RL step ran in this call), ``data["ok"]`` when exact;
    ``startup``: the start-up's split (``train/startup.py``; empty when no RL step ran)."""

    eval_before: float | None = None
    eval_after: float | None = None
    steps: int = 0
    interrupted: bool = False
    sft_interrupted: bool = False
    wall_s: float = 0.0
    data: dict | None = None
    startup: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def last_line(self, out: Path) -> str:
        if self.sft_interrupted:
            return (
                "[trainer] interrupted during the SFT warm start; nothing saved; "
                "run the same command to start it again"
            )
        if self.interrupted:
            return (
                f"[trainer] interrupted at step {self.steps} after {self.wall_s:.0f}s"
                f"{self._data()}; checkpoint saved in {out}; run the same command to resume"
            )
        return (
            f"[trainer] done in {self.wall_s:.0f}s: held-out accuracy "
            f"{_fmt(self.eval_before)} -> {_fmt(self.eval_after)} "
            f"after {self.steps} RL steps{self._data()}; outputs in {out}"
        )

    def _data(self) -> str:
        """The data accounting's part of the last line (nothing when no RL step ran)."""
        d = self.data
        if d is None:
            return ""
        if not d["ok"]:
            return "; DATA ACCOUNTING MISMATCH (summary.json 'data', run.log)"
        return (
            f"; data exact: {d['trained']} prompts trained once, {d['no_signal']} "
            f"no-signal, {d['in_flight']} in flight"
        )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def finish(out: Path, summary: RunSummary) -> None:
    """Write ``out/summary.json`` (process 0) and say the run's last line."""
    if multihost.is_primary():
        (out / "summary.json").write_text(json.dumps(summary.to_json(), indent=2))
    log.info(summary.last_line(out))


def finish_reports(
    run: Any,
    last_trajs: Sequence[Trajectory],
    eval_trajs: Sequence[Trajectory],
) -> None:
    """Close the metrics writer, then the PNG plot of reward/accuracy and the HTML page
    of sample trajectories (held-out and the last training batch)."""
    rc = run.config
    run.writer.close()
    if rc.logging.plot:
        try:
            plot_metrics(run.writer.jsonl_path, run.out / "metrics.png", title=rc.trainer.out_dir)
        except ValueError as e:  # nothing to plot yet (e.g. zero RL steps)
            log.info(f"[trainer] no plot: {e}")
    k = rc.logging.report_trajectories
    trajs = list(eval_trajs)[:k] + list(last_trajs)[:k]
    if trajs:
        write_trajectory_report(
            trajs,
            run.out / "trajectories.html",
            title=f"{rc.trainer.out_dir}: held-out (greedy) and last training batch",
            tokenizer=run.tokenizer,
        )
