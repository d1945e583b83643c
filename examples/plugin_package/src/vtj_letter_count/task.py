"""The ``letter_count`` task: "How many times does the letter 'r' occur in 'strawberry'?"

Words are drawn from a seeded generator of pronounceable letter strings, so the task
needs no data download; the letter asked about occurs in the word half of the time
(0 is a valid answer otherwise). Rows use the verl layout (``data_source`` is
``letter_count``, so the reward of the same name scores them); no (letter, word) pair is
in both the training and the evaluation split. The SFT demonstrations call the tool::

    <count>r in strawberry</count>  |  obs_template.format(obs="3")  |  <answer>3</answer>

This module is the package's ``verltool_jax.tasks`` entry point: it has the two
attributes a task has, ``TASK_CONFIG`` and ``write_task_from_config``.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from verltool_jax.data.readers import write_rows
from verltool_jax.tasks import TaskFiles
from vtj_letter_count import TAG, count_letter

DATA_SOURCE = "letter_count"
SYSTEM_PROMPT = f"Count with <{TAG}>letter in word</{TAG}>; answer as <answer>number</answer>."
CONSONANTS = "bcdfghklmnprstvz"
VOWELS = "aeiou"


@dataclass(frozen=True)
class LetterCountTask:
    """The ``task`` config section of letter_count."""

    name: str = "letter_count"
    num_train: int = 512
    num_eval: int = 64
    num_demos: int = 128  # SFT demonstrations, from the training split
    min_syllables: int = 2  # a word is 2..4 consonant-vowel syllables, maybe a final consonant
    max_syllables: int = 4
    seed: int = 0


def make_word(rng: random.Random, min_syllables: int, max_syllables: int) -> str:
    """A pronounceable lower-case word such as ``"kaberot"``."""
    n = rng.randint(min_syllables, max_syllables)
    word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(n))
    return word + (rng.choice(CONSONANTS) if rng.random() < 0.5 else "")


def make_row(letter: str, word: str, index: int, split: str) -> dict:
    """One verl-layout row asking how often ``letter`` occurs in ``word``."""
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": f"How many times does the letter '{letter}' occur in '{word}'?",
            },
        ],
        "data_source": DATA_SOURCE,
        "ability": "counting",
        "reward_model": {"style": "rule", "ground_truth": str(count_letter(letter, word))},
        "extra_info": {"split": split, "index": index, "letter": letter, "word": word},
    }


def demonstration(letter: str, word: str, obs_template: str) -> list[dict]:
    """The demonstrated response: the tool call, its observation (no loss), the answer."""
    n = str(count_letter(letter, word))
    return [
        {"text": f"<{TAG}>{letter} in {word}</{TAG}>", "loss": True},
        {"text": obs_template.format(obs=n), "loss": False},
        {"text": f"<answer>{n}</answer>", "loss": True},
    ]


def generate(task: LetterCountTask, obs_template: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(train rows, eval rows, SFT rows); deterministic in ``task.seed``."""
    if not 1 <= task.min_syllables <= task.max_syllables:
        raise ValueError(
            f"task.min_syllables={task.min_syllables} and task.max_syllables="
            f"{task.max_syllables} must satisfy 1 <= min <= max"
        )
    if task.num_demos > task.num_train:
        raise ValueError(
            f"task.num_demos={task.num_demos} must be <= task.num_train={task.num_train} "
            "(demonstrations come from the training split)"
        )
    rng = random.Random(task.seed)
    pairs: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    draws = 0
    while len(pairs) < task.num_eval + task.num_train:
        draws += 1
        if draws > 100 * (task.num_eval + task.num_train):
            raise ValueError(
                f"cannot draw {task.num_train + task.num_eval} distinct questions with "
                f"task.max_syllables={task.max_syllables}; raise it or ask for fewer"
            )
        word = make_word(rng, task.min_syllables, task.max_syllables)
        letter = rng.choice(word) if rng.random() < 0.5 else rng.choice(CONSONANTS + VOWELS)
        if (letter, word) not in seen:
            seen.add((letter, word))
            pairs.append((letter, word))
    evals = [make_row(c, w, i, "eval") for i, (c, w) in enumerate(pairs[: task.num_eval])]
    train = [make_row(c, w, i, "train") for i, (c, w) in enumerate(pairs[task.num_eval :])]
    sft = [
        {
            **row,
            "response_segments": demonstration(
                row["extra_info"]["letter"], row["extra_info"]["word"], obs_template
            ),
        }
        for row in train[: task.num_demos]
    ]
    return train, evals, sft


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """Write ``train/eval/sft.parquet`` under ``out_dir`` from ``config.task`` (a
    :class:`LetterCountTask`) and ``config.rollout.obs_template``."""
    train, evals, sft = generate(config.task, config.rollout.obs_template)
    out = Path(out_dir)
    return TaskFiles(
        train=write_rows(train, out / "train.parquet"),
        eval=write_rows(evals, out / "eval.parquet"),
        sft=write_rows(sft, out / "sft.parquet"),
    )


TASK_CONFIG = LetterCountTask
