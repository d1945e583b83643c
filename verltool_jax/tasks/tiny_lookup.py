"""The tiny_lookup task: look a code up, then multiply it, with two tools.

tiny_math's sibling for agents that need several calls (the per-turn credit ablation):
a synthetic corpus holds one short passage per key (title ``item5170``, text ``code
4821``), indexed with BM25 (``tool_server.retrieval``), and a question asks ``What is
the code of item5170 times 37?``. The code is only in the corpus and the product is too
long to guess, so the answer needs ``<search>item5170</search>``, then
``<python>print(4821 * 37)</python>``, then ``<answer>178377</answer>``. A key is
``item`` and four digits: BM25 keeps it one term (a code never matches it), and the tiny
tokenizer splits digits one a token, which the tiny model learns to copy (keys of random
letters it did not copy after 150 SFT steps). Keys, codes and factors of fixed lengths
put every copied number at a fixed distance from its copy, which the tiny model learns
in 200 SFT steps (with 3- or 4-digit codes it had not, loss 0.93 against 0.11). One
question per key; the held-out questions ask about keys that no training question asks
about. Rows use the verl layout (``data_source="tiny_lookup"``, scored by the math
reward; ``reward_model.ground_truth`` the product as a string).

The SFT demonstrations (training rows) hold both observations as the tools return them,
formatted by the rollout's own observation formatter (``"observation": True``)::

    <search>item5170</search> | <information>Doc 1 (Title: item5170) code 4821</information>
    <python>print(4821 * 37)</python> | 178377\\n | <answer>178377</answer><eos>
    (trained | observation, loss 0, alternating)

The data goes to ``train/eval/sft.parquet`` and ``corpus.jsonl`` under the data folder;
the index to ``tool_server.tool_opt.retrieval_index`` (where the run's tool server reads
it), built once and reused while it holds this corpus (same fingerprint).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tool_server.kit.search_format import format_information
from tool_server.retrieval.corpus import Document, corpus_fingerprint, write_corpus
from tool_server.retrieval.index import RetrievalIndexError, build_index, read_meta
from verltool_jax.data.readers import write_rows
from verltool_jax.tasks import TaskFiles

DATA_SOURCE = "tiny_lookup"
TASK_REWARD = "math"  # the reward of held-out rows whose data_source has none
SYSTEM_PROMPT = (
    "Find codes as <search>key</search>; run python as <python>code</python>; "
    "answer as <answer>number</answer>."
)
CORPUS_FILE = "corpus.jsonl"
KEY_PREFIX = "item"


def question(key: str, factor: int) -> str:
    return f"What is the code of {key} times {factor}?"


def passage(key: str, code: int) -> tuple[str, str]:
    """The corpus passage of ``key``: (title, text)."""
    return key, f"code {code}"


def draw_keys(n: int, rng: random.Random) -> list[str]:
    """``n`` distinct keys ``item`` + 4 digits (``item4821``)."""
    capacity = 9000
    if not 0 <= n <= capacity // 2:
        raise ValueError(
            f"cannot draw {n} distinct keys (at most {capacity // 2}); "
            "lower task.num_train + task.num_eval"
        )
    return [f"{KEY_PREFIX}{k}" for k in rng.sample(range(1000, 10000), n)]


def draw_number(digits: Sequence[int], rng: random.Random) -> int:
    """A number with a digit count drawn from ``digits``."""
    d = rng.choice(digits)
    return rng.randint(10 ** (d - 1), 10**d - 1)


def make_row(key: str, code: int, factor: int, index: int, split: str) -> dict:
    """One verl-layout row asking for ``code(key) * factor``."""
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question(key, factor)},
        ],
        "data_source": DATA_SOURCE,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(code * factor)},
        "extra_info": {"split": split, "index": index, "key": key, "code": code, "factor": factor},
    }


def demonstration_segments(key: str, code: int, factor: int) -> list[dict]:
    """The demonstrated response (module doc): each observation is what its tool returns
    (``search_retrieval`` with topk 1: ``format_information`` of the one passage;
    ``python_code``: what ``print`` writes, the value and a newline)."""
    product = str(code * factor)
    return [
        {"text": f"<search>{key}</search>", "loss": True},
        {"text": format_information([passage(key, code)]), "loss": False, "observation": True},
        {"text": f"<python>print({code} * {factor})</python>", "loss": True},
        {"text": product + "\n", "loss": False, "observation": True},
        {"text": f"<answer>{product}</answer>", "loss": True},
    ]


@dataclass(frozen=True)
class TinyLookupTask:
    """The ``task`` config section of tiny_lookup."""

    name: str = "tiny_lookup"
    code_digits: tuple[int, ...] = (4,)  # the looked-up codes
    factor_digits: tuple[int, ...] = (2,)  # the multipliers in the questions
    num_train: int = 2000
    num_eval: int = 200
    num_demos: int = 256  # SFT demonstrations
    seed: int = 1234


def generate(
    num_train: int,
    num_eval: int,
    num_demos: int,
    code_digits: Sequence[int] = (4,),
    factor_digits: Sequence[int] = (2,),
    seed: int = 0,
) -> tuple[list[dict], list[dict], list[dict], list[Document]]:
    """(train rows, held-out eval rows, SFT rows, corpus); deterministic in ``seed``."""
    if num_demos > num_train:
        raise ValueError(
            f"num_demos={num_demos} must be <= num_train={num_train} "
            "(demonstrations are drawn from the training split)"
        )
    for field, digits in (("code_digits", code_digits), ("factor_digits", factor_digits)):
        if not digits or any(d < 1 for d in digits):
            raise ValueError(f"task.{field} must be digit counts >= 1, got {tuple(digits)}")
    rng = random.Random(seed)
    keys = draw_keys(num_eval + num_train, rng)
    codes = [draw_number(code_digits, rng) for _ in keys]
    factors = [draw_number(factor_digits, rng) for _ in keys]
    rows = [
        make_row(k, c, f, i if i < num_eval else i - num_eval, "eval" if i < num_eval else "train")
        for i, (k, c, f) in enumerate(zip(keys, codes, factors))
    ]
    evals, train = rows[:num_eval], rows[num_eval:]
    corpus = [Document(str(i), *passage(k, c)) for i, (k, c) in enumerate(zip(keys, codes))]
    sft = []
    for row in train[:num_demos]:
        x = row["extra_info"]
        sft.append(
            {**row, "response_segments": demonstration_segments(x["key"], x["code"], x["factor"])}
        )
    return train, evals, sft, corpus


def ensure_index(corpus: list[Document], corpus_path: Path, index_dir: str | os.PathLike) -> None:
    """A BM25 index of ``corpus`` at ``index_dir``: kept if it holds exactly this corpus
    (same fingerprint), else built beside it and moved into place."""
    index_dir = Path(index_dir)
    if index_dir.is_dir():
        try:
            if read_meta(str(index_dir)).get("corpus_fingerprint") == corpus_fingerprint(corpus):
                return
        except (RetrievalIndexError, ValueError, OSError):
            pass  # not a complete index: build it again
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=index_dir.name + ".", dir=index_dir.parent)
    build_index(str(corpus_path), tmp, "bm25", docs=corpus)
    shutil.rmtree(index_dir, ignore_errors=True)
    os.replace(tmp, index_dir)


def write_task(
    out_dir: str | os.PathLike,
    index_dir: str | os.PathLike,
    num_train: int,
    num_eval: int,
    num_demos: int,
    code_digits: Sequence[int] = (4,),
    factor_digits: Sequence[int] = (2,),
    seed: int = 0,
) -> TaskFiles:
    """Generate the task; write ``train/eval/sft.parquet`` and ``corpus.jsonl`` under
    ``out_dir`` and its index to ``index_dir``."""
    train, evals, sft, corpus = generate(
        num_train, num_eval, num_demos, code_digits, factor_digits, seed
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_corpus(str(out / CORPUS_FILE), corpus)
    ensure_index(corpus, out / CORPUS_FILE, index_dir)
    return TaskFiles(
        train=write_rows(train, out / "train.parquet"),
        eval=write_rows(evals, out / "eval.parquet"),
        sft=write_rows(sft, out / "sft.parquet"),
    )


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """``write_task`` with the sizes of ``config.task`` and the index at
    ``config.tool_server.tool_opt["retrieval_index"]``."""
    t = config.task
    index = str(config.tool_server.tool_opt.get("retrieval_index") or "")
    if not index:
        raise ValueError(
            "task tiny_lookup writes its index where the tool server reads it, but "
            "tool_server.tool_opt.retrieval_index is empty; set it, e.g. "
            "--config.tool_server.tool_opt.retrieval_index=runs/tiny_lookup_index"
        )
    if "search_retrieval" not in config.tool_server.tools:
        raise ValueError(
            "task tiny_lookup needs the search_retrieval tool; add it to "
            f"tool_server.tools (got {tuple(config.tool_server.tools)})"
        )
    return write_task(
        out_dir,
        index,
        t.num_train,
        t.num_eval,
        t.num_demos,
        tuple(t.code_digits),
        tuple(t.factor_digits),
        t.seed,
    )


TASK_CONFIG = TinyLookupTask
