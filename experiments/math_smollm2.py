"""SmolLM2-135M-Instruct on math word problems with the sandboxed python tool: held-out
accuracy before training, after the SFT warm start, and after GRPO.

    python experiments/math_smollm2.py --data-dir /path/to/data --out runs/math_smollm2
    python experiments/math_smollm2.py --data-dir /path/to/data --out /tmp/smoke --smoke

On CPU the ``smol`` stages use the vLLM CPU sampler (set ``VLLM_ENABLE_V1_MULTIPROCESSING=0
VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false`` as ``scripts/test.sh`` does).

``configs/vt_math.py:smol`` (``--smoke``: ``:tiny``, seconds): the SFT warm start trains on
the GSM8K demonstrations (calculator annotations turned into python calls), GRPO on GSM8K
training problems; evaluation on GSM8K test, SVAMP and MAWPS (``task.num_eval`` problems of
each, 300 / 150 / 150 in ``smol``). Stages, resumption, outputs and options: see
``experiments/sft_grpo_stages.py`` (base; per seed sft, grpo; ``--stages``, ``--set``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sft_grpo_stages import STAGES, Recipe, run_script  # noqa: F401
from sft_grpo_stages import main as run_stages


def _check_data(data_dir: str) -> str | None:
    if not (Path(data_dir) / "gsm8k" / "train.jsonl").is_file():
        return "no gsm8k/train.jsonl there"
    return None


RECIPE = Recipe(
    name="math_smollm2",
    config_file="configs/vt_math.py",
    title="SmolLM2-135M-Instruct + python tool",
    metric="accuracy",
    data_help="directory with gsm8k/{train,test}.jsonl and math/*_test.jsonl",
    check_data=_check_data,
    data_overrides=lambda data_dir, out, smoke: [("task.data_dir", data_dir)],
)


def main(argv: Sequence[str] | None = None) -> int:
    return run_stages(RECIPE, argv, __doc__)


if __name__ == "__main__":
    run_script(RECIPE, __doc__)
