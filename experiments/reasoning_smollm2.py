"""SmolLM2-135M-Instruct learns procedural reasoning tasks (reasoning-gym) with the
sandboxed python tool: base -> SFT -> GRPO on a pass-rate-filtered pool with a difficulty
curriculum, two seeds; greedy pass@1 and sampled pass@8 (T=0.6, the training temperature) on held-out reasoning-gym items
of fixed levels (one above the highest trained) and on GSM8K / MAWPS / SVAMP.

    python experiments/reasoning_smollm2.py --data-dir /path/to/data --out runs/reasoning_smollm2
    python experiments/reasoning_smollm2.py --data-dir /path/to/data --out /tmp/smoke --smoke

``--data-dir`` holds the math family's files (``gsm8k/test.jsonl``,
``math/mawps_test.jsonl``, ``math/svamp_test.jsonl``); the reasoning-gym items are
generated (``verltool_jax.tasks.reasoning_gym``). ``configs/vt_reasoning.py:smol``
(``--smoke``: ``:tiny``, seconds): the SFT warm start on demonstrations whose python
programs the run's tool server ran and the dataset's scorer accepted; the pass-rate
filter (``--filter``, default here ``8``: 8 samples per training prompt under the SFT
model, keep 0 < rate < 1; ``--filter-limit``, default here 48 prompts); GRPO with the
curriculum on the kept prompts, evaluating 16 held-out items per level every 10 steps. Stages, resumption, outputs and the other
options: ``experiments/sft_grpo_stages.py``. On CPU set ``VLLM_ENABLE_V1_MULTIPROCESSING=0
VLLM_CPU_KVCACHE_SPACE=2 TOKENIZERS_PARALLELISM=false``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sft_grpo_stages import Overrides, Recipe
from sft_grpo_stages import main as run_stages

MATH_FILES = ("gsm8k/test.jsonl", "math/mawps_test.jsonl", "math/svamp_test.jsonl")


def _check_data(data_dir: str) -> str | None:
    missing = [f for f in MATH_FILES if not (Path(data_dir) / f).is_file()]
    return f"missing {', '.join(missing)}" if missing else None


def data_overrides(data_dir: str, out: Path, smoke: bool) -> Overrides:
    files = MATH_FILES[:1] if smoke else MATH_FILES
    return [("task.data_dir", data_dir), ("task.math_eval_files", ",".join(files))]


RECIPE = Recipe(
    name="reasoning_smollm2",
    config_file="configs/vt_reasoning.py",
    title="SmolLM2-135M-Instruct + python tool (reasoning-gym)",
    metric="accuracy",
    data_help="directory with gsm8k/test.jsonl, math/mawps_test.jsonl, math/svamp_test.jsonl",
    check_data=_check_data,
    data_overrides=data_overrides,
    grpo_overrides=(
        ("curriculum.enabled", "true"),
        # held-out accuracy during training: the reasoning-gym levels only, 16 items each
        ("task.math_eval_files", "()"),
        ("data.max_eval_examples", "16"),
        ("trainer.eval_every", "10"),
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for flag, value in (
        ("--filter", "8"),
        ("--filter-limit", "48"),  # 48 training prompts x 8 samples: ~8 min here
        ("--samples", "8"),
        ("--temperature", "0.6"),  # the temperature GRPO samples at (smol)
    ):
        if not any(x == flag or x.startswith(flag + "=") for x in argv):
            argv += [flag, value]
    return run_stages(RECIPE, argv, __doc__)


if __name__ == "__main__":
    from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()
    sys.exit(main())
