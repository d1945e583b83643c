"""The math family's data (VT-Math): GSM8K, MATH and simple test sets in the verl layout.

Source files are read as they are published:

* GSM8K jsonl: ``question``, ``answer`` = worked solution ending in ``#### N``, with
  calculator annotations ``<<48/2=24>>`` after each computed step;
* MATH-style json / jsonl (MATH, MATH-500, AIME, AMC): ``problem`` and ``answer``, or a
  ``solution`` whose last ``\\boxed{...}`` is the answer;
* simple test sets: ``{question|problem, answer}``; SVAMP (``Body`` + ``Question``,
  ``Answer``); MAWPS (``input``, ``target``).

Every problem becomes a verl row whose prompt is a system message (how to call the python
tool and how to answer, ``system_prompt``) and the question; the trainer renders it with
the model's own chat template (``verltool_jax.data.templating``). ``data_source`` is the
set's name (``gsm8k``, ``math500``, ``svamp``, ...), which selects the math reward.

SFT demonstrations come from GSM8K's annotations: every ``<<expr=value>>`` becomes a
``print(expr)`` line of one python call; its observation is what python prints for those
lines (computed here by a restricted arithmetic evaluator with python's own number
semantics, and kept only if each printed value equals the annotation), then the worked
solution without annotations and ``<answer>N</answer>``::

    <python>\\nprint(16-3-4)\\nprint(9*2)\\n</python>  | obs_template.format(obs="9\\n18\\n") | text <answer>18</answer>
                 trained (loss 1)                   |        observation (loss 0)         |   trained (loss 1)

Usage::

    python -m verltool_jax.tasks.math_data --out runs/math_data \\
        --train gsm8k/train.jsonl --eval gsm8k/test.jsonl math/svamp_test.jsonl --demos 256
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import operator
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from verltool_jax.data.readers import write_rows
from verltool_jax.data.rows import DataRowError
from verltool_jax.rewards.answer_extraction import last_boxed
from verltool_jax.tasks import TaskFiles

log = logging.getLogger(__name__)
DEFAULT_OBS_TEMPLATE = "<result>\n{obs}\n</result>"
_ANNOTATION_RE = re.compile(r"<<([^<>=]*)=([^<>]*)>>")


def python_tool_prompt(obs_template: str, lead: str, answer: str) -> str:
    """Instructions for a task solved with the python tool: ``lead`` (what to do), the
    python tool's syntax, where its output appears (from ``obs_template``), and the answer
    format ``<answer>...</answer>`` holding ``answer``."""
    if obs_template.count("{obs}") != 1:
        raise ValueError(f"obs_template must contain '{{obs}}' once, got {obs_template!r}")
    before, after = (s.strip() for s in obs_template.split("{obs}"))
    shown = f"{before}...{after}" if before or after else "the next message"
    return (
        f"{lead} You may run Python to calculate: write the code inside "
        "<python>...</python> and print() the values you need; what it prints comes back "
        f"as {shown}. Give the final answer as <answer>...</answer> ({answer})."
    )


def system_prompt(obs_template: str = DEFAULT_OBS_TEMPLATE) -> str:
    """The instructions: python tool syntax, where its output appears, the answer format."""
    return python_tool_prompt(
        obs_template, "Solve the math problem.", "a number or expression; \\boxed{...} also works"
    )


@dataclass(frozen=True)
class Problem:
    """One problem of a source file; ``where`` is ``file:line`` (or ``file item i``)."""

    question: str
    answer: str
    data_source: str
    where: str
    solution: str | None = None  # GSM8K worked solution (with annotations)


def set_name(path: str | os.PathLike) -> str:
    """The set's name from its path: ``math/svamp_test.jsonl`` -> ``svamp``,
    ``gsm8k/test.jsonl`` -> ``gsm8k``, ``math/math_train.json`` -> ``math``."""
    p = Path(path)
    stem = re.sub(r"[_-]?(test|train|dev|val)$", "", p.stem)
    return stem or p.parent.name or p.stem


def _records(path: Path) -> Iterator[tuple[str, dict]]:
    """``(where, record)`` for every record of a .jsonl / .json / .parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, rec in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path} row {i}", rec
        return
    text = path.read_text(encoding="utf-8")
    if suffix == ".json" and text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # a .json file holding JSON lines
        if isinstance(data, list):
            for i, rec in enumerate(data):
                yield f"{path} item {i}", rec
            return
        if isinstance(data, dict):
            yield f"{path} item 0", data
            return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{lineno}", json.loads(line)
        except json.JSONDecodeError as e:
            raise DataRowError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None


def format_number(x) -> str:
    """``27.0`` -> ``"27"``, ``0.5`` -> ``"0.5"``, ``"1,000"`` -> ``"1000"``; strings pass
    through stripped (only digit-group commas removed)."""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    if isinstance(x, (int, float)):
        return repr(x)
    s = str(x).strip()
    return s.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s) else s


# "9 (apples)": a number followed by its unit in parentheses (ASDiv's answers)
_NUMBER_WITH_UNIT_RE = re.compile(r"([-+]?(?:\d[\d,]*)?\.?\d+(?:/\d+)?)\s*\([^()]*\)")
_ANSWER_LAYOUTS = "a number, GSM8K's '... #### N', '9 (apples)' or '\\boxed{...}'"


def answer_text(value, where: str, field: str) -> str:
    """The ground truth held in a record's ``field``, as the math reward compares it
    (``rewards.math_reward.math_equivalent``): a JSON number; a string in one of the
    common layouts, GSM8K's worked solution ending ``#### N`` (-> ``N``), LaTeX
    ``\\boxed{X}`` (-> ``X``, the last one, via ``rewards.answer_extraction.last_boxed``),
    a number with its unit in parentheses ``9 (apples)`` (-> ``9``, as ASDiv writes
    them), or any other answer text (a MATH expression) as it is; digit-group commas are
    dropped (``format_number``). Anything else (a list, an object, true/false, an empty
    string, an unbalanced ``\\boxed{``) is a ``DataRowError`` naming ``where`` and
    ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        shown = json.dumps(value, default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise DataRowError(
            f"{where}: field {field!r} holds {type(value).__name__} {shown}; expected "
            f"the answer as {_ANSWER_LAYOUTS}"
        )
    if isinstance(value, float) and value != value:  # NaN: a missing cell of a table
        raise DataRowError(f"{where}: field {field!r} is empty (NaN); give the answer")
    if not isinstance(value, str):
        return format_number(value)
    text = value.strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    if "\\boxed" in text or "\\fbox" in text:
        inner = last_boxed(text)
        if inner is None:
            raise DataRowError(
                f"{where}: field {field!r} has an unbalanced \\boxed{{ ({value[:60]!r}); "
                "close its braces"
            )
        text = inner
    m = _NUMBER_WITH_UNIT_RE.fullmatch(text)
    if m:
        text = m.group(1)
    if not text:
        raise DataRowError(
            f"{where}: field {field!r} is empty ({value[:60]!r}); expected the answer as "
            f"{_ANSWER_LAYOUTS}"
        )
    return format_number(text)


def _question_of(rec: dict, where: str) -> str:
    """The question: ``question`` or ``problem`` (the first that is set), or a body and
    its question joined (SVAMP writes ``Body`` / ``Question``, ASDiv ``body`` /
    ``question``), or MAWPS's ``input``; a ``DataRowError`` naming the field otherwise."""
    pairs = [
        (b, q) for b, q in (("Body", "Question"), ("body", "question")) if b in rec and q in rec
    ]
    fields = pairs[0] if pairs else [f for f in ("question", "problem", "input") if rec.get(f)][:1]
    if not fields:
        raise DataRowError(
            f"{where}: no question (expected a 'question' or 'problem' field, or "
            f"'body' + 'question'; the row has {sorted(rec)[:8]})"
        )
    parts = []
    for f in fields:
        if not isinstance(rec[f], str):
            raise DataRowError(
                f"{where}: field {f!r} holds {type(rec[f]).__name__}; expected the question's text"
            )
        parts.append(rec[f].strip())
    question = " ".join(p for p in parts if p)
    if not question:
        raise DataRowError(f"{where}: no question (field {fields[-1]!r} is empty)")
    return question


def parse_record(rec: dict, where: str, data_source: str) -> Problem:
    """A ``Problem`` from one record of any supported layout (see the module doc): the
    question by ``_question_of``, the answer (``answer``, ``Answer`` or ``target``, else
    the last ``\\boxed{}`` of a ``solution``) by :func:`answer_text`. A record without a
    question or an answer, or with one that cannot be read, is a ``DataRowError`` naming
    ``where`` (file and line, or row) and the field."""
    if not isinstance(rec, dict):
        raise DataRowError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    question = _question_of(rec, where)
    field = next((f for f in ("answer", "Answer", "target") if rec.get(f) is not None), None)
    raw = rec.get(field) if field else None
    if isinstance(raw, str) and not raw.strip():
        field = raw = None
    solution = raw if isinstance(raw, str) and "####" in raw else None  # GSM8K
    if field is None and isinstance(rec.get("solution"), str):
        boxed = last_boxed(rec["solution"])
        if boxed:
            field, raw = "solution", boxed
    if field is None:
        raise DataRowError(
            f"{where}: no answer (expected 'answer' (GSM8K: '... #### N'), "
            "'Answer', 'target', or a 'solution' with \\boxed{...})"
        )
    return Problem(question, answer_text(raw, where, field), data_source, where, solution)


def read_problems(
    path: str | os.PathLike,
    data_source: str | None = None,
    limit: int | None = None,
    skip_invalid: bool = False,
) -> list[Problem]:
    """The problems of one source file (the first ``limit`` if given). A record without a
    question or answer raises ``DataRowError`` (file and line), or with ``skip_invalid``
    is left out with a warning that names each one."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"math data file {str(p)!r} does not exist")
    ds = data_source or set_name(p)
    out, skipped = [], []
    for where, rec in _records(p):
        if limit is not None and len(out) >= limit:
            break
        try:
            out.append(parse_record(rec, where, ds))
        except DataRowError as e:
            if not skip_invalid:
                raise
            skipped.append(str(e))
    if skipped:
        log.warning("%s: skipped %d record(s): %s", p, len(skipped), "; ".join(skipped))
    return out


def make_row(
    prob: Problem, index: int, split: str, obs_template: str = DEFAULT_OBS_TEMPLATE
) -> dict:
    """The verl row of one problem."""
    return {
        "prompt": [
            {"role": "system", "content": system_prompt(obs_template)},
            {"role": "user", "content": prob.question},
        ],
        "data_source": prob.data_source,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": prob.answer},
        "extra_info": {"split": split, "index": index, "source": prob.where},
    }


# ------------------------------------------------------------- calculator annotations
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def safe_eval(expr: str):
    """Evaluate an arithmetic expression (numbers, ``+ - * / // % **``, unary signs,
    parentheses) with python's own int / float semantics, so ``str(result)`` is exactly
    what ``print(expr)`` prints. Anything else (names, calls, huge powers) is a ValueError."""
    tree = ast.parse(expr.strip(), mode="eval")

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        raise ValueError(f"not plain arithmetic: {ast.dump(node)[:60]}")

    try:
        return ev(tree)
    except (ZeroDivisionError, OverflowError) as e:
        raise ValueError(str(e)) from None


def _matches(value, annotated: str) -> bool:
    """``value`` equals the annotation, allowing the annotation's own rounding."""
    s = annotated.strip().replace(",", "")
    try:
        want = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return False
    got = Fraction(value)
    if got == want:
        return True
    decimals = len(s.split(".")[1]) if "." in s else 0
    return abs(got - want) <= Fraction(1, 2 * 10**decimals)


def demonstration_segments(
    prob: Problem, obs_template: str = DEFAULT_OBS_TEMPLATE
) -> list[dict] | None:
    """The demonstrated response for a GSM8K problem (see the module doc), or None when it
    has no annotation or one that is not plain arithmetic equal to its stated value."""
    if obs_template.count("{obs}") != 1:
        raise ValueError(f"obs_template must contain '{{obs}}' once, got {obs_template!r}")
    if not prob.solution:
        return None
    body = prob.solution.rsplit("####", 1)[0]
    calls = _ANNOTATION_RE.findall(body)
    if not calls:
        return None
    lines, printed = [], []
    for expr, annotated in calls:
        expr = expr.strip()
        try:
            value = safe_eval(expr)
        except (ValueError, SyntaxError):
            return None
        if not _matches(value, annotated):
            return None
        lines.append(f"print({expr})")
        printed.append(str(value))
    text = _ANNOTATION_RE.sub("", body).strip()
    return [
        {"text": "<python>\n" + "\n".join(lines) + "\n</python>", "loss": True},
        {"text": obs_template.format(obs="\n".join(printed) + "\n"), "loss": False},
        {"text": f"\n{text}\n<answer>{prob.answer}</answer>", "loss": True},
    ]


# ------------------------------------------------------------------- the task files
@dataclass(frozen=True)
class MathTask:
    """The ``task`` config section of the math family (``configs/vt_math.py``); paths are
    relative to ``data_dir`` (absolute paths are used as they are)."""

    name: str = "vt_math"
    data_dir: str = "data"
    train_files: tuple[str, ...] = ("gsm8k/train.jsonl",)
    eval_files: tuple[str, ...] = (
        "gsm8k/test.jsonl",
        "math/svamp_test.jsonl",
        "math/mawps_test.jsonl",
    )
    num_train: int = 0  # 0: all
    num_eval: int = 0  # per eval file; 0: all
    eval_sizes: tuple[int, ...] = ()  # per eval file, in order (overrides num_eval; 0: all)
    max_calc_steps: int = 0  # train only on problems with <= N annotated steps; 0: all
    num_demos: int = 0  # SFT demonstrations from GSM8K annotations; 0: all
    seed: int = 1234
    skip_invalid: bool = False  # True: leave out (warned) rows without an answer


TASK_CONFIG = MathTask


def calc_steps(prob: Problem) -> int | None:
    """The number of calculator annotations ``<<expr=value>>`` in a GSM8K worked solution
    (None for problems without one, e.g. MATH)."""
    return None if prob.solution is None else len(_ANNOTATION_RE.findall(prob.solution))


def _check_eval_sizes(eval_files: Sequence[str], eval_sizes: Sequence[int]) -> None:
    if eval_sizes and eval_files and len(eval_sizes) != len(eval_files):
        raise ValueError(
            f"task.eval_sizes has {len(eval_sizes)} entries for "
            f"{len(eval_files)} task.eval_files; give one count per file or ()"
        )


def write_eval_files(
    out_dir: str | os.PathLike,
    eval_files: Sequence[str],
    num_eval: int = 0,
    obs_template: str = DEFAULT_OBS_TEMPLATE,
    skip_invalid: bool = False,
    eval_sizes: Sequence[int] = (),
) -> tuple[Path, ...]:
    """Write ``eval_<set>.parquet`` under ``out_dir`` for each held-out source file: its
    first ``eval_sizes[j]`` (or ``num_eval``; 0: all) problems as verl rows. Reads
    nothing else (an evaluation prepares no training data)."""
    _check_eval_sizes(eval_files, eval_sizes)
    out = Path(out_dir)
    evals = []
    for j, f in enumerate(eval_files):
        limit = eval_sizes[j] if eval_sizes else num_eval
        probs = read_problems(f, limit=limit or None, skip_invalid=skip_invalid)
        evals.append(
            write_rows(
                [make_row(p, i, "eval", obs_template) for i, p in enumerate(probs)],
                out / f"eval_{set_name(f)}.parquet",
            )
        )
    return tuple(evals)


def write_task(
    out_dir: str | os.PathLike,
    train_files: Sequence[str],
    eval_files: Sequence[str],
    num_train: int = 0,
    num_eval: int = 0,
    num_demos: int = 0,
    seed: int = 0,
    obs_template: str = DEFAULT_OBS_TEMPLATE,
    skip_invalid: bool = False,
    eval_sizes: Sequence[int] = (),
    max_calc_steps: int = 0,
) -> TaskFiles:
    """Read the source files and write ``train.parquet``, ``eval_<set>.parquet`` (one per
    eval file) and ``sft.parquet`` under ``out_dir``. ``num_*`` = 0: all; ``eval_sizes``
    gives one count per eval file instead of ``num_eval``. Training problems are shuffled
    with ``seed``; ``max_calc_steps`` > 0 keeps only those whose GSM8K solution has at most
    that many calculator steps (an easier curriculum for a small model; problems without a
    worked solution are kept). Demonstrations come from the training problems with usable
    annotations (so only GSM8K-style training files give demonstrations).
    ``skip_invalid``: leave out (with a warning) records without a question or answer
    instead of failing on the first."""
    if not train_files:
        raise ValueError("task.train_files is empty: give GSM8K / MATH training files")
    _check_eval_sizes(eval_files, eval_sizes)
    rng = random.Random(seed)
    train = [p for f in train_files for p in read_problems(f, skip_invalid=skip_invalid)]
    if max_calc_steps:
        train = [p for p in train if (calc_steps(p) or 0) <= max_calc_steps]
    rng.shuffle(train)
    train = train[:num_train] if num_train else train
    out = Path(out_dir)
    rows = [make_row(p, i, "train", obs_template) for i, p in enumerate(train)]
    train_path = write_rows(rows, out / "train.parquet")
    evals = write_eval_files(out, eval_files, num_eval, obs_template, skip_invalid, eval_sizes)
    sft = []
    for i, p in enumerate(train):
        if num_demos and len(sft) >= num_demos:
            break
        segs = demonstration_segments(p, obs_template)
        if segs is not None:
            sft.append({**rows[i], "response_segments": segs})
    if num_demos and not sft:
        raise ValueError(
            "no SFT demonstrations: the training files have no usable GSM8K "
            "calculator annotations; set task.num_demos=0 or add GSM8K train"
        )
    return TaskFiles(
        train=train_path,
        eval=tuple(evals),
        sft=write_rows(sft, out / "sft.parquet") if sft else None,
    )


def _in(data_dir: str, path: str) -> str:
    return str(Path(data_dir).expanduser() / path) if data_dir else path


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """``write_task`` with ``config.task`` (files relative to ``task.data_dir``) and
    ``config.rollout.obs_template``."""
    t = config.task
    return write_task(
        out_dir,
        [_in(t.data_dir, f) for f in t.train_files],
        [_in(t.data_dir, f) for f in t.eval_files],
        t.num_train,
        t.num_eval,
        t.num_demos,
        t.seed,
        config.rollout.obs_template,
        t.skip_invalid,
        t.eval_sizes,
        t.max_calc_steps,
    )


def write_eval_from_config(config, out_dir: str | os.PathLike) -> tuple[Path, ...]:
    """Only the held-out files of ``config.task`` (``write_eval_files``), for an
    evaluation: the training files are neither read nor written."""
    t = config.task
    return write_eval_files(
        out_dir,
        [_in(t.data_dir, f) for f in t.eval_files],
        t.num_eval,
        config.rollout.obs_template,
        t.skip_invalid,
        t.eval_sizes,
    )


TASK_REWARD = "math"  # the reward of rows whose data_source has none (an unseen test set)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m verltool_jax.tasks.math_data",
        description="Write GSM8K / MATH / test sets as verl parquet (train, eval_<set>, sft).",
    )
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--train", nargs="+", required=True, help="training source files")
    ap.add_argument("--eval", nargs="*", default=[], help="held-out source files")
    ap.add_argument("--num-train", type=int, default=0, help="0: all")
    ap.add_argument("--num-eval", type=int, default=0, help="per eval file; 0: all")
    ap.add_argument("--demos", type=int, default=0, help="SFT demonstrations; 0: all usable")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--obs-template", default=DEFAULT_OBS_TEMPLATE)
    ap.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out records without a question/answer (warned) instead of failing",
    )
    a = ap.parse_args(argv)
    try:
        tf = write_task(
            a.out,
            a.train,
            a.eval,
            a.num_train,
            a.num_eval,
            a.demos,
            a.seed,
            a.obs_template,
            a.skip_invalid,
        )
    except (DataRowError, FileNotFoundError, ValueError) as e:
        ap.exit(2, f"error: {e}\n")
    from verltool_jax.data.readers import read_raw

    for path in (tf.train, *tf.eval, tf.sft):
        if path is not None:
            print(f"{path}: {len(read_raw(path))} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
