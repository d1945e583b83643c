"""reasoning-gym datasets as a task with the python tool: procedural items by name and
difficulty level, each scored by its own dataset's scorer.

``task.datasets`` names any reasoning-gym datasets (``basic_arithmetic``, ``chain_sum``,
``products``, ``decimal_arithmetic``, ``leg_counting``, ``time_intervals``,
``calendar_arithmetic``, ``gsm_symbolic``, ...); a level is the dataset's reasoning-gym
curriculum at that global level (:func:`verltool_jax.rewards.reasoning_gym_reward.level_settings`),
``task.options`` adds fixed settings per dataset (JSON, e.g.
``{"time_intervals": {"task_types": ["time", "time_seconds", "date"]}}``).

Files written (verl layout, ``data_source="reasoning_gym"``, the item and its settings in
the ground truth, the reward is the dataset's own ``score_answer``):

* ``train.parquet``: ``num_train`` items per dataset and level of ``train_levels``,
  each row labelled ``extra_info["difficulty"] = {"group": dataset, "level": L}`` for the
  curriculum (:mod:`verltool_jax.data.curriculum`);
* ``eval_level<L>.parquet`` per level of ``eval_levels``: ``num_eval`` items per dataset
  (the datasets in turn), generated from another seed and never equal (same question) to
  a training item;
* ``eval_<set>.parquet`` per file of ``math_eval_files`` (GSM8K, MAWPS, SVAMP, ... read by
  :mod:`verltool_jax.tasks.math_data`, scored by the math reward), ``math_eval_size`` each;
* ``sft.parquet``: demonstrations from training items of ``demo_levels``. A dataset's
  demonstration program (:data:`PROGRAMS`: ``print(<expression>)`` for arithmetic, the leg
  counts for ``leg_counting``, ``datetime`` for times and dates, the worked solution's
  equations for ``gsm_symbolic``) is run by the run's own tool server
  (:mod:`verltool_jax.tasks.demonstrations`); a demonstration is kept only when the
  answer read from the tool's output scores 1 with the dataset's scorer::

    <python>\\nprint(60 * 93)\\n</python> | obs_template.format(obs="5580\\n") | <answer>5580</answer>

Usage (the tool server is started with the python tool to validate demonstrations)::

    python -m verltool_jax.tasks.reasoning_gym --out runs/rg_data --datasets chain_sum,products
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verltool_jax.data.readers import write_rows
from verltool_jax.rewards import reasoning_gym_reward as rgr
from verltool_jax.tasks import TaskFiles
from verltool_jax.tasks.math_data import (
    DEFAULT_OBS_TEMPLATE,
    _matches,
    python_tool_prompt,
    read_problems,
    safe_eval,
    set_name,
)
from verltool_jax.tasks.math_data import make_row as math_row


@dataclass(frozen=True)
class ReasoningGymTask:
    """The ``task`` config section of ``reasoning_gym`` (see the module doc)."""

    name: str = "reasoning_gym"
    datasets: tuple[str, ...] = ("basic_arithmetic", "chain_sum", "products", "leg_counting")
    options: str = ""  # JSON {dataset: {setting: value}} applied at every level
    train_levels: tuple[int, ...] = (0, 1, 2)
    eval_levels: tuple[int, ...] = (0, 1, 2, 3)
    num_train: int = 200  # per dataset and training level
    num_eval: int = 20  # per dataset and held-out level
    num_demos: int = 32  # SFT demonstrations per dataset
    demo_levels: tuple[int, ...] = (0, 1)
    data_dir: str = ""  # where math_eval_files are (relative paths)
    math_eval_files: tuple[str, ...] = ()  # e.g. gsm8k/test.jsonl, math/mawps_test.jsonl
    math_eval_size: int = 100  # per math eval file; 0: all
    seed: int = 1234


TASK_CONFIG = ReasoningGymTask


def system_prompt(obs_template: str = DEFAULT_OBS_TEMPLATE) -> str:
    return python_tool_prompt(
        obs_template, "Solve the problem.", "only the answer, in the form the question asks for"
    )


def parse_options(text: str) -> dict[str, dict[str, Any]]:
    """``task.options`` as ``{dataset: {setting: value}}``; a clear error otherwise."""
    if not text.strip():
        return {}
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"task.options is not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(opts, dict) or not all(isinstance(v, dict) for v in opts.values()):
        raise ValueError(
            "task.options must be a JSON object {dataset: {setting: value}}, e.g. "
            '{"products": {"allow_negation": true}}'
        )
    return opts


def item_seed(base: int, dataset: str, level: int, split: str) -> int:
    """A stable seed per (task seed, dataset, level, split) (crc32, not Python's hash)."""
    return (base * 1_000_003 + zlib.crc32(f"{dataset}/{level}/{split}".encode())) % (2**31)


def settings_for(dataset: str, level: int, options: dict[str, dict[str, Any]]) -> dict:
    return {**rgr.level_settings(dataset, level), **options.get(dataset, {})}


def make_row(
    dataset: str,
    level: int,
    settings: dict,
    entry: dict,
    index: int,
    split: str,
    obs_template: str = DEFAULT_OBS_TEMPLATE,
) -> dict:
    """The verl row of one item."""
    return {
        "prompt": [
            {"role": "system", "content": system_prompt(obs_template)},
            {"role": "user", "content": entry["question"]},
        ],
        "data_source": rgr.DATA_SOURCE,
        "ability": "reasoning",
        "reward_model": {
            "style": "rule",
            "ground_truth": rgr.ground_truth(dataset, settings, entry),
        },
        "extra_info": {
            "split": split,
            "index": index,
            "dataset": dataset,
            "level": level,
            "difficulty": {"group": dataset, "level": level},
            **({"set": f"rg_level{level}"} if split == "eval" else {}),
        },
    }


def generate_items(
    dataset: str, level: int, n: int, seed: int, options: dict, exclude: set[str] = frozenset()
) -> tuple[dict, list[dict]]:
    """(settings, ``n`` items of ``dataset`` at ``level`` whose questions are not in
    ``exclude`` nor repeated); fewer when the level has fewer distinct items."""
    settings = settings_for(dataset, level, options)
    pool = max(4 * n, n + 64)
    ds = rgr.make_dataset(dataset, settings, seed=seed, size=pool)
    out, seen = [], set(exclude)
    for i in range(pool):
        if len(out) >= n:
            break
        e = ds[i]
        if e["question"] in seen:
            continue
        seen.add(e["question"])
        out.append(e)
    return settings, out


# ---------------------------------------------------------------- demonstration programs
def _arithmetic(entry: dict) -> str | None:
    expr = entry["metadata"].get("expression")
    return f"print({expr})" if expr else None


def _decimal(entry: dict) -> str | None:
    m = re.fullmatch(r"([-+*/().\d ]+)=\s*\?", entry["question"].strip().splitlines()[-1])
    return f"print(round({m.group(1).strip()}, 10))" if m else None


def _legs(entry: dict) -> str | None:
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    animals = entry["metadata"].get("animals") or {}
    if not animals or any(a not in ANIMALS for a in animals):
        return None
    return "print(" + " + ".join(f"{n}*{ANIMALS[a]}" for a, n in animals.items()) + ")"


_DURATION_PRINT = {
    "time": 'print(f"{s // 3600:02d}:{s % 3600 // 60:02d}")',
    "time_seconds": 'print(f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}")',
}


def _duration(entry: dict) -> str | None:
    from datetime import datetime

    m = entry["metadata"]
    kind, fmt = m.get("task_type"), m.get("format")
    if kind not in ("time", "time_seconds", "time_ms", "date") or not fmt:
        return None
    a, b = (datetime.fromisoformat(m[k]).strftime(fmt) for k in ("start_time", "end_time"))
    if kind == "time_ms":
        a, b = a[:-3], b[:-3]  # %f prints microseconds; the question shows milliseconds
    head = f'from datetime import datetime\nf = "{fmt}"\n'
    head += f'd = datetime.strptime("{b}", f) - datetime.strptime("{a}", f)\n'
    if kind == "date":
        return head + 'print(f"{d.days} days")'
    if kind == "time_ms":
        return head + (
            "t = d.total_seconds()\n"
            'print(f"{int(t // 3600):02d}:{int(t % 3600 // 60):02d}:{int(t % 60):02d}.'
            '{int(t % 1 * 1000):03d}")'
        )
    return head + "s = int(d.total_seconds())\n" + _DURATION_PRINT[kind]


def _date_args(iso: str) -> str:
    y, mo, d = (int(x) for x in iso.split("-"))
    return f"{y}, {mo}, {d}"


def _calendar(entry: dict) -> str | None:
    m = entry["metadata"]
    task = m.get("task")
    if task == "weekday_of_date":
        return (
            f'import datetime\nprint(datetime.date({_date_args(m["target_date"])}).strftime("%A"))'
        )
    if task == "is_leap_year":
        return f'import calendar\nprint("Yes" if calendar.isleap({m["year"]}) else "No")'
    if task == "weekday_offset":
        return (
            "import datetime\n"
            f"d = datetime.date({_date_args(m['start_date'])}) + "
            f"datetime.timedelta(days={m['offset_days']})\n"
            'print(d.strftime("%A"))'
        )
    return None


_EQUATION = re.compile(r"([\d.]+(?:\s*[-+*/]\s*\(?\s*[\d.]+\s*\)?)+)\s*=\s*\$?(-?[\d.,]+)")


def _gsm_symbolic(entry: dict) -> str | None:
    cot = entry["metadata"].get("answer_cot") or ""
    lines = []
    for expr, value in _EQUATION.findall(cot.split("####")[0]):
        try:
            if not _matches(safe_eval(expr), value.rstrip(".,")):
                return None
        except (ValueError, SyntaxError, ZeroDivisionError):
            return None
        lines.append(f"print({expr.strip()})")
    return "\n".join(lines) or None


# dataset -> its demonstration program for an item (None: no demonstration of that item)
PROGRAMS: dict[str, Callable[[dict], str | None]] = {
    "basic_arithmetic": _arithmetic,
    "chain_sum": _arithmetic,
    "products": _arithmetic,
    "decimal_arithmetic": _decimal,
    "leg_counting": _legs,
    "time_intervals": _duration,
    "calendar_arithmetic": _calendar,
    "gsm_symbolic": _gsm_symbolic,
}


def answer_from_output(output: str) -> str | None:
    """The answer a demonstration gives from the tool's output: its last printed line
    (a float with an integer value written as an integer)."""
    lines = [x.strip() for x in output.strip().splitlines() if x.strip()]
    if not lines:
        return None
    last = lines[-1]
    try:
        f = float(last)
        if f.is_integer() and re.fullmatch(r"-?\d+\.0+", last):
            return str(int(f))
    except ValueError:
        pass
    return last


def proposals(rows: Sequence[dict]) -> list:
    """One :class:`~verltool_jax.tasks.demonstrations.Proposal` per row with a program."""
    from verltool_jax.tasks.demonstrations import Proposal

    out = []
    for row in rows:
        gt = json.loads(row["reward_model"]["ground_truth"])
        program = PROGRAMS.get(gt["dataset"], lambda e: None)(gt["entry"])
        if program is None:
            continue

        def final(obs: str, gt: dict = gt) -> str | None:
            ans = answer_from_output(obs)
            return f"<answer>{ans}</answer>" if ans and rgr.score(ans, gt) >= 1.0 else None

        out.append(Proposal(row=row, action=f"<python>\n{program}\n</python>", final=final))
    return out


# ------------------------------------------------------------------------ the task files
def _check(t: ReasoningGymTask) -> dict:
    if not t.datasets:
        raise ValueError("task.datasets is empty: name reasoning-gym datasets, e.g. chain_sum")
    known = set(rgr.known_datasets())
    for name in t.datasets:
        if name not in known:
            rgr.make_dataset(name, {}, 0, 1)  # the error with a suggestion
    for field in ("train_levels", "eval_levels", "demo_levels"):
        if any(lv < 0 for lv in getattr(t, field)):
            raise ValueError(f"task.{field}: levels are >= 0, got {getattr(t, field)}")
    if not t.train_levels:
        raise ValueError("task.train_levels is empty: give at least one level, e.g. (0,)")
    for field in ("num_train", "num_eval", "num_demos", "math_eval_size"):
        if getattr(t, field) < 0:
            raise ValueError(f"task.{field} must be >= 0, got {getattr(t, field)}")
    return parse_options(t.options)


def write_task(
    t: ReasoningGymTask,
    out_dir: str | os.PathLike,
    run_config: Any = None,
    obs_template: str = DEFAULT_OBS_TEMPLATE,
) -> TaskFiles:
    """Generate and write the files of the module doc under ``out_dir``. Demonstrations
    need ``run_config`` (its tool server validates them); without one none are made."""
    options = _check(t)
    out = Path(out_dir)
    evals: list[Path] = []
    held_out: dict[str, set[str]] = {d: set() for d in t.datasets}
    for level in t.eval_levels:
        per_dataset = []
        for d in t.datasets:
            settings, items = generate_items(
                d, level, t.num_eval, item_seed(t.seed, d, level, "eval"), options
            )
            held_out[d].update(e["question"] for e in items)
            per_dataset.append([(d, settings, e) for e in items])
        # the datasets in turn, so that the first rows of a file cover every dataset
        order = [
            x
            for i in range(t.num_eval)
            for items in per_dataset
            if i < len(items)
            for x in [items[i]]
        ]
        rows = [
            make_row(d, level, st, e, i, "eval", obs_template) for i, (d, st, e) in enumerate(order)
        ]
        evals.append(write_rows(rows, out / f"eval_level{level}.parquet"))
    for f in t.math_eval_files:
        path = str(Path(t.data_dir).expanduser() / f) if t.data_dir else f
        probs = read_problems(path, limit=t.math_eval_size or None)
        evals.append(
            write_rows(
                [math_row(p, i, "eval", obs_template) for i, p in enumerate(probs)],
                out / f"eval_{set_name(f)}.parquet",
            )
        )
    train: list[dict] = []
    for level in t.train_levels:
        for d in t.datasets:
            settings, items = generate_items(
                d,
                level,
                t.num_train,
                item_seed(t.seed, d, level, "train"),
                options,
                exclude=held_out[d],
            )
            train += [
                make_row(d, level, settings, e, len(train) + i, "train", obs_template)
                for i, e in enumerate(items)
            ]
    random.Random(t.seed).shuffle(train)
    for i, row in enumerate(train):
        row["extra_info"]["index"] = i
    sft = None
    if t.num_demos and run_config is not None:
        sft = write_rows(demonstrations(t, train, run_config), out / "sft.parquet")
    return TaskFiles(train=write_rows(train, out / "train.parquet"), eval=tuple(evals), sft=sft)


def demonstrations(t: ReasoningGymTask, train: Sequence[dict], run_config: Any) -> list[dict]:
    """Up to ``num_demos`` validated demonstrations per dataset (from ``demo_levels``)."""
    from verltool_jax.tasks.demonstrations import demonstrate

    levels = set(t.demo_levels)
    cand = [r for r in train if r["extra_info"]["level"] in levels]
    by_ds: dict[str, list[dict]] = {}
    for r in cand:
        by_ds.setdefault(r["extra_info"]["dataset"], []).append(r)
    # interleave the datasets so every one gets its share of the tool calls
    props = proposals([r for group in zip(*by_ds.values()) for r in group] if by_ds else [])
    kept = demonstrate(run_config, props, limit=t.num_demos * len(by_ds)) if props else []
    counts: dict[str, int] = {}
    out = []
    for row in kept:
        d = row["extra_info"]["dataset"]
        if counts.get(d, 0) < t.num_demos:
            counts[d] = counts.get(d, 0) + 1
            out.append(row)
    if not out:
        raise ValueError("reasoning_gym: no demonstration was kept; set task.num_demos=0")
    return out


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """``write_task`` with ``config.task`` and ``config.rollout.obs_template``."""
    return write_task(
        config.task, out_dir, run_config=config, obs_template=config.rollout.obs_template
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m verltool_jax.tasks.reasoning_gym",
        description="Write reasoning-gym datasets as verl parquet (train, eval_level<L>, sft).",
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--datasets", default=",".join(ReasoningGymTask.datasets))
    ap.add_argument("--train-levels", default="0,1,2")
    ap.add_argument("--eval-levels", default="0,1,2,3")
    ap.add_argument("--num-train", type=int, default=ReasoningGymTask.num_train)
    ap.add_argument("--num-eval", type=int, default=ReasoningGymTask.num_eval)
    ap.add_argument("--seed", type=int, default=ReasoningGymTask.seed)
    ap.add_argument("--options", default="")
    a = ap.parse_args(argv)

    def ints(s: str) -> tuple[int, ...]:
        return tuple(int(x) for x in s.split(",") if x.strip())

    t = ReasoningGymTask(
        datasets=tuple(x for x in a.datasets.split(",") if x),
        train_levels=ints(a.train_levels),
        eval_levels=ints(a.eval_levels),
        num_train=a.num_train,
        num_eval=a.num_eval,
        num_demos=0,
        seed=a.seed,
        options=a.options,
    )
    try:
        files = write_task(t, a.out)
    except (ValueError, ImportError) as e:
        ap.exit(2, f"error: {e}\n")
    from verltool_jax.data.readers import read_raw

    for path in (files.train, *files.eval):
        print(f"{path}: {len(read_raw(path))} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
