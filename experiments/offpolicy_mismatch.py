"""The sampler/trainer mismatch of an ``offpolicy`` sweep's runs, per arm: the mean over
RL steps of the k3 KL estimate, the fraction of tokens masked, the IS weight, and the
largest token ratio of the run (``algos.offpolicy.mismatch_metrics``).

    python experiments/offpolicy_mismatch.py runs/sweeps_tiny_math/offpolicy

Prints a markdown table (one row per arm and seed); a run without the metrics (the
sampler arm reads no recomputed logprobs) shows ``-``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verltool_jax import metric_names as names
from verltool_jax.reporting.metrics_writer import read_metrics

COLUMNS = (
    ("KL k3 (mean)", f"train/{names.TRAIN_MISMATCH_KL_K3}", "mean"),
    ("masked frac (mean)", f"train/{names.TRAIN_OFFPOLICY_MASKED_FRAC}", "mean"),
    ("IS weight (mean)", f"train/{names.TRAIN_TIS_WEIGHT_MEAN}", "mean"),
    ("ratio max (run)", f"train/{names.TRAIN_MISMATCH_RATIO_MAX}", "max"),
)


def summarise(records: list[dict], key: str, how: str) -> float | None:
    """Mean or max of ``key`` over the records that have it (None if none does)."""
    vals = [float(r[key]) for r in records if r.get(key) is not None]
    if not vals:
        return None
    return max(vals) if how == "max" else sum(vals) / len(vals)


def table(sweep_dir: Path) -> str:
    """The markdown table of every ``<arm>/seed<k>/metrics.jsonl`` under ``sweep_dir``."""
    lines = [
        "| arm | seed | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for jsonl in sorted(sweep_dir.glob("*/seed*/metrics.jsonl")):
        recs = read_metrics(jsonl)
        cells = []
        for _, key, how in COLUMNS:
            v = summarise(recs, key, how)
            cells.append("-" if v is None else f"{v:.4g}")
        arm, seed = jsonl.parent.parent.name, jsonl.parent.name
        lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    print(table(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
