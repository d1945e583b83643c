"""SmolLM2-135M-Instruct on text-to-SQL (Spider, single-table questions) with the sql tool:
held-out execution accuracy before training, after an SFT warm start and after GRPO.

    python experiments/sql_smollm2.py --data-dir /path/to/spider --out runs/sql_smollm2
    python experiments/sql_smollm2.py --data-dir /path/to/spider --out /tmp/smoke --smoke

``--data-dir`` is the Spider folder as downloaded (``train_queries.csv``,
``test_queries.csv``, ``databases/<db>/schema.sql`` and ``data/*.csv``); each run turns
the databases it uses into sqlite files (``python -m verltool_jax.tasks.spider``).

``configs/vt_sql.py:smol`` (``--smoke``: ``:tiny``, seconds): the SFT warm start trains on
demonstrations (run the gold query with the sql tool, read its rows, give it as the
solution) from Spider train, GRPO on Spider train questions with the execution-match
reward (-1 without a solution); evaluation on 200 Spider-dev questions (other databases)
prints execution accuracy overall and by hardness. Stages, resumption, outputs and
options: see ``experiments/sft_grpo_stages.py``. On CPU set
``VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=2 TOKENIZERS_PARALLELISM=false``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sft_grpo_stages import Overrides, Recipe, run_script
from sft_grpo_stages import main as run_stages


def _check_data(data_dir: str) -> str | None:
    missing = [
        f
        for f in ("train_queries.csv", "test_queries.csv", "databases")
        if not (Path(data_dir) / f).exists()
    ]
    return f"missing {', '.join(missing)} (give the Spider folder)" if missing else None


def data_overrides(data_dir: str, out: Path, smoke: bool) -> Overrides:
    # the tiny variant makes no demonstrations and trains no SFT itself
    more = [("task.num_demos", "4"), ("sft.steps", "1")] if smoke else []
    return [("task.spider_dir", data_dir)] + more


RECIPE = Recipe(
    name="sql_smollm2",
    config_file="configs/vt_sql.py",
    title="SmolLM2-135M-Instruct + sql tool (Spider)",
    metric="execution accuracy",
    data_help="the Spider folder (train_queries.csv, test_queries.csv, databases/)",
    check_data=_check_data,
    data_overrides=data_overrides,
)


def main(argv: Sequence[str] | None = None) -> int:
    return run_stages(RECIPE, argv, __doc__)


if __name__ == "__main__":
    run_script(RECIPE, __doc__)
