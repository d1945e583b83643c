"""SmolLM2-135M-Instruct on retrieval QA (NQ-open, HotpotQA) with a search tool over a local
corpus: held-out exact match before training, after an SFT warm start and after GRPO.

    python experiments/search_smollm2.py --data-dir /path/to/qa --out runs/search_smollm2
    python experiments/search_smollm2.py --data-dir /path/to/qa --out /tmp/smoke --smoke

``--data-dir`` holds the upstream files as downloaded: ``nq_open_dev.jsonl``,
``hotpotqa_dev_subsampled.jsonl``, ``hotpotqa_train.json``, ``hotpotqa_train_corpus.json``
and ``2wikimultihopqa_corpus.json``. Once per ``--out``, the corpus (the four corpus
files) is indexed with BM25 under ``<out>/qa_index`` and the recall step keeps the
questions whose answer is in the top 10 for the question itself (the ones the corpus can
answer at all); ``task.num_eval`` (200) of those are held out, the rest train.

``configs/vt_search.py:smol`` (``--smoke``: ``:tiny``, seconds): the SFT warm start trains
on demonstrations (search the question, read the real top-3 passages, answer with the
gold answer found in them), GRPO on the training questions with exact match minus a
format penalty; evaluation prints EM, F1, searches per question and gold retrieval per
data set. Stages, resumption, outputs and options: see ``experiments/sft_grpo_stages.py``.
On CPU set ``VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=2
TOKENIZERS_PARALLELISM=false`` as ``scripts/test.sh`` does.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sft_grpo_stages import Overrides, Recipe, run_script
from sft_grpo_stages import main as run_stages

QUESTIONS = ("hotpotqa_dev_subsampled.jsonl", "hotpotqa_train.json", "nq_open_dev.jsonl")
CORPUS = (
    "hotpotqa_dev_subsampled.jsonl",
    "hotpotqa_train.json",
    "hotpotqa_train_corpus.json",
    "2wikimultihopqa_corpus.json",
)


def _check_data(data_dir: str) -> str | None:
    missing = [f for f in sorted(set(QUESTIONS + CORPUS)) if not (Path(data_dir) / f).is_file()]
    return f"missing {', '.join(missing)}" if missing else None


def _tuple(paths: Sequence[str]) -> str:
    return "(" + "".join(f"{p!r}," for p in paths) + ")"


def data_overrides(data_dir: str, out: Path, smoke: bool) -> Overrides:
    """Build the BM25 index and the answerable list under ``out/qa_index`` once (the
    retrieval CLI prints the recall table), and point the config at them."""
    index = out / "qa_index"
    answerable = index / "answerable.json"
    questions = [str(Path(data_dir) / f) for f in QUESTIONS]
    corpus = [str(Path(data_dir) / f) for f in CORPUS]
    if not answerable.is_file():
        from tool_server.retrieval.__main__ import main as retrieval

        code = retrieval(
            [
                "build",
                "--corpus",
                *corpus,
                "--out",
                str(index),
                "--kind",
                "bm25",
                "--questions",
                *questions,
                "--answerable-out",
                str(answerable),
            ]
        )
        if code:
            raise SystemExit(f"building the index under {index} failed (exit {code})")
    # the tiny variant makes no demonstrations and trains no SFT itself
    more = [("task.num_demos", "8"), ("sft.steps", "1")] if smoke else []
    return [
        ("task.train_files", _tuple(questions)),
        ("task.corpus_files", _tuple(corpus)),
        ("task.answerable_ids", str(answerable)),
        ("tool_server.tool_opt.retrieval_index", str(index)),
    ] + more


RECIPE = Recipe(
    name="search_smollm2",
    config_file="configs/vt_search.py",
    title="SmolLM2-135M-Instruct + BM25 search",
    metric="exact match",
    data_help="directory with nq_open_dev.jsonl, hotpotqa_* and 2wikimultihopqa_corpus.json",
    check_data=_check_data,
    data_overrides=data_overrides,
)


def main(argv: Sequence[str] | None = None) -> int:
    return run_stages(RECIPE, argv, __doc__)


if __name__ == "__main__":
    run_script(RECIPE, __doc__)
