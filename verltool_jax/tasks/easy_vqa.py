"""The easy_vqa task: visual questions about 64x64 images of one coloured shape, with the
image tool (``crop_image`` / ``zoom_in`` / ``rotate``).

Data: the easy-VQA data set (PyPI ``easy-vqa``, MIT; 38,575 train / 9,673 test questions over
4,000 / 1,000 images; 13 answers: shapes, colours, yes / no). Rows use verl's multimodal
layout: the user message marks the image with ``<image>``, ``images`` lists it (a file path
inside the installed package), ``extra_info.images`` hands the same image to the image tool,
``reward_model.ground_truth`` is the answer (reward ``visual_answer``, shaped by the
Pixel-Reasoner curiosity terms in ``rewards/visual_reward.py``). Evaluation rows come from
the package's test split (other images).

SFT demonstrations zoom into the image before answering::

    <tool_call>{"name": "zoom_in", ...}</tool_call> | observation: the zoomed image | <answer>A</answer>
                     trained (loss 1)                 |       (loss 0)               |   trained

They are produced by rolling out a scripted teacher through the real rollout and tool server
(``demonstration_actions``), so the demonstration's ids and images are exactly what RL sees.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from verltool_jax.data.readers import write_rows
from verltool_jax.tasks import TaskFiles

DATA_SOURCE = "easy_vqa"
SYSTEM_PROMPT = (
    "Look at the image. You may zoom in with <tool_call>{...}</tool_call>; "
    "answer as <answer>word</answer>."
)
ZOOM_BOX = [0.125, 0.125, 0.875, 0.875]


def zoom_action(box=ZOOM_BOX, factor: float = 1.5) -> str:
    """The demonstrated tool call: zoom into the middle of the image."""
    return (
        "<tool_call>"
        + json.dumps({"name": "zoom_in", "arguments": {"bbox": list(box), "factor": factor}})
        + "</tool_call>"
    )


def answer_action(answer: str) -> str:
    return f"<answer>{answer}</answer>"


def demonstration_actions(row: dict) -> list[str]:
    """The teacher's model turns for ``row``: zoom in, then answer."""
    return [zoom_action(), answer_action(str(row["reward_model"]["ground_truth"]))]


def make_row(question: str, answer: str, image_path: str, index: int, split: str) -> dict:
    """One verl multimodal row."""
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"<image>{question}"},
        ],
        "images": [image_path],
        "data_source": DATA_SOURCE,
        "ability": "visual",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "images": [image_path]},
    }


def load_split(split: str) -> list[tuple[str, str, str]]:
    """``(question, answer, image path)`` of the easy-VQA ``train`` or ``test`` split."""
    try:
        import easy_vqa
    except ImportError:
        raise ImportError(
            "the easy_vqa task needs the easy-vqa package: pip install easy-vqa"
        ) from None
    if split == "train":
        qs, answers, ids = easy_vqa.get_train_questions()
        paths = easy_vqa.get_train_image_paths()
    elif split == "test":
        qs, answers, ids = easy_vqa.get_test_questions()
        paths = easy_vqa.get_test_image_paths()
    else:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return [(q, a, paths[i]) for q, a, i in zip(qs, answers, ids)]


def all_answers() -> list[str]:
    import easy_vqa

    return list(easy_vqa.get_answers())


SHAPES = ("circle", "rectangle", "triangle")  # easy-VQA's shapes; the rest are colours


def answer_kind(answer: str) -> str:
    """What a question with gold ``answer`` asks: ``yes/no``, ``shape`` or ``color``."""
    a = answer.strip().lower()
    return "yes/no" if a in ("yes", "no") else "shape" if a in SHAPES else "color"


@dataclass(frozen=True)
class EasyVQATask:
    """The ``task`` config section of easy_vqa."""

    name: str = "easy_vqa"
    num_train: int = 2000
    num_eval: int = 200
    num_demos: int = 256  # SFT demonstrations (from the training rows)
    seed: int = 1234


def generate(
    num_train: int, num_eval: int, num_demos: int, seed: int = 0
) -> tuple[list[dict], list[dict], list[dict]]:
    """``(train, eval, demo rows)``: random questions of the train / test splits; the demo
    rows are the first ``num_demos`` training rows (their responses come from
    ``demonstration_actions`` through the rollout)."""
    rng = random.Random(seed)
    train_all, test_all = load_split("train"), load_split("test")
    if num_train > len(train_all) or num_eval > len(test_all):
        raise ValueError(
            f"easy-VQA has {len(train_all)} train / {len(test_all)} test questions; "
            f"asked for {num_train} / {num_eval}"
        )
    train = [
        make_row(q, a, p, i, "train")
        for i, (q, a, p) in enumerate(rng.sample(train_all, num_train))
    ]
    evals = [
        make_row(q, a, p, i, "eval") for i, (q, a, p) in enumerate(rng.sample(test_all, num_eval))
    ]
    return train, evals, train[:num_demos]


def write_task(
    out_dir: str | os.PathLike, num_train: int, num_eval: int, num_demos: int, seed: int = 0
) -> TaskFiles:
    """Write ``train/eval/demos.parquet`` under ``out_dir``. ``demos.parquet`` holds prompt
    rows only (their responses are rolled out, see the module doc), so ``TaskFiles.sft`` is
    None: the text SFT path (``response_segments``) does not apply."""
    train, evals, demos = generate(num_train, num_eval, num_demos, seed)
    out = Path(out_dir)
    write_rows(demos, out / "demos.parquet")
    return TaskFiles(
        train=write_rows(train, out / "train.parquet"), eval=write_rows(evals, out / "eval.parquet")
    )


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    t = config.task
    return write_task(out_dir, t.num_train, t.num_eval, t.num_demos, t.seed)


TASK_CONFIG = EasyVQATask
