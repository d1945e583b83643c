"""The tiny_math task: multiply two n-digit numbers, with a python tool.

A tiny model cannot multiply 4-digit numbers in its head, but it can learn to write
``<python>print(A * B)</python>``, read the tool's observation and copy the product into
``<answer>PRODUCT</answer>``. Rows use the verl layout (``data_source="tiny_math"``,
``reward_model.ground_truth`` the product as a string); the evaluation split is
disjoint from the training split (no (A, B) pair is in both), and the SFT
demonstrations come from the training split::

    <python>print(A * B)</python>  |  obs_template.format(obs=PRODUCT)  |  <answer>PRODUCT</answer><eos>
        trained (loss 1)           |         observation (loss 0)        |      trained (loss 1)

With ``task.native_tools`` (native tool calls: an agent program through the gateway,
``examples/gateway_agent.py``, or our agent loop with ``rollout.tool_format="hermes"``,
which renders the same conversation) the prompts ask for a ``python_code`` call, and the
demonstrations are the conversation the gateway renders for that program with the tiny
model's ChatML template: the prompt with the Hermes tool block in the system message,
then ``<tool_call>{"name": "python_code", "arguments": {"code": "print(A * B)"}}</tool_call><eos>``
(trained), the tool turn and the next generation prompt (not trained), the answer.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verltool_jax.data.readers import write_rows
from verltool_jax.rollout.config import OBS_TEMPLATE_RESULT
from verltool_jax.tasks import TaskFiles

DATA_SOURCE = "tiny_math"
TASK_REWARD = "math"  # the reward of held-out rows whose data_source has none
SYSTEM_PROMPT = "Run python as <python>code</python>; answer as <answer>number</answer>."
NATIVE_SYSTEM_PROMPT = "Call python_code to compute; answer as <answer>number</answer>."
DEFAULT_OBS_TEMPLATE = OBS_TEMPLATE_RESULT


def question(a: int, b: int) -> str:
    return f"What is {a} * {b}?"


def make_row(a: int, b: int, index: int, split: str, native: bool = False) -> dict:
    """One verl-layout row asking for ``a * b`` (``native``: with a native tool call)."""
    return {
        "prompt": [
            {"role": "system", "content": NATIVE_SYSTEM_PROMPT if native else SYSTEM_PROMPT},
            {"role": "user", "content": question(a, b)},
        ],
        "data_source": DATA_SOURCE,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a * b)},
        "extra_info": {"split": split, "index": index, "a": a, "b": b},
    }


def demonstration_segments(a: int, b: int, obs_template: str = DEFAULT_OBS_TEMPLATE) -> list[dict]:
    """The demonstrated response: action, observation (no loss), answer."""
    if obs_template.count("{obs}") != 1:
        raise ValueError(f"obs_template must contain '{{obs}}' once, got {obs_template!r}")
    product = str(a * b)
    return [
        {"text": f"<python>print({a} * {b})</python>", "loss": True},
        # exactly what the python tool returns for print(): the value and a newline
        {"text": obs_template.format(obs=product + "\n"), "loss": False},
        {"text": f"<answer>{product}</answer>", "loss": True},
    ]


def native_demonstration(row: dict, tool_prompt: str = "hermes") -> dict:
    """The SFT row of ``row`` for an agent program with native tool calls (module doc):
    the prompt as the gateway renders it (``chat.render.normalize_messages`` with the
    program's tool list and the run's ``gateway.tool_prompt``), the segments cut from the
    ChatML rendering of the whole conversation so that each turn's text is what the
    gateway gives the sampler."""
    import jinja2

    from tool_server.tools.python_code import PythonCodeTool
    from verltool_jax.chat.render import normalize_messages
    from verltool_jax.chat.tool_parsers import format_calls_as_text
    from verltool_jax.models.tiny import CHATML_TEMPLATE

    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    product = str(a * b)
    template = jinja2.Environment().from_string(CHATML_TEMPLATE)
    call = {"function": {"name": "python_code", "arguments": {"code": f"print({a} * {b})"}}}
    action = format_calls_as_text([call], "hermes")
    msgs = normalize_messages(
        row["prompt"],
        [PythonCodeTool().function_schema()],
        raw_replies={},
        template=CHATML_TEMPLATE,
        fmt="hermes",
        tool_prompt=tool_prompt,
    )
    turn1 = template.render(messages=msgs, add_generation_prompt=True)
    msgs2 = msgs + [
        {"role": "assistant", "content": action},
        {"role": "tool", "content": product + "\n"},  # what print() gives the program
    ]
    turn2 = template.render(messages=msgs2, add_generation_prompt=True)
    eos = "<|im_end|>"
    if not turn2.startswith(turn1 + action + eos):
        raise ValueError("native_demonstration: the template does not extend turn 1")
    observation = turn2[len(turn1) + len(action + eos) :]
    return {
        **row,
        "prompt": msgs,
        "response_segments": [
            {"text": action + eos, "loss": True},
            {"text": observation, "loss": False},
            {"text": f"<answer>{product}</answer>", "loss": True},
        ],
    }


def sample_pairs(
    n: int, digits: Sequence[int], rng: random.Random, exclude: set = frozenset()
) -> list[tuple[int, int]]:
    """``n`` distinct (a, b) pairs, each factor with a digit count drawn from ``digits``."""
    if n < 0 or not digits or any(d < 1 for d in digits):
        raise ValueError(f"need n >= 0 and digits >= 1, got n={n}, digits={tuple(digits)}")
    capacity = sum((9 * 10 ** (d - 1)) for d in digits) ** 2
    if n + len(exclude) > capacity // 2:
        raise ValueError(
            f"cannot draw {n} distinct pairs with digits={tuple(digits)}; "
            "use more digits or fewer problems"
        )
    out: list[tuple[int, int]] = []
    seen = set(exclude)
    while len(out) < n:
        da, db = rng.choice(digits), rng.choice(digits)
        pair = (rng.randint(10 ** (da - 1), 10**da - 1), rng.randint(10 ** (db - 1), 10**db - 1))
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


@dataclass(frozen=True)
class TinyMathTask:
    """The ``task`` config section of tiny_math."""

    name: str = "tiny_math"
    digits: tuple[int, ...] = (4,)  # factor sizes; (4,): 4-digit x 4-digit
    num_train: int = 2000
    num_eval: int = 200
    num_demos: int = 256  # SFT demonstrations
    seed: int = 1234
    # prompts and demonstrations for native tool calls (the gateway variant; module doc)
    native_tools: bool = False


def generate(
    num_train: int,
    num_eval: int,
    num_demos: int,
    digits: Sequence[int] = (4,),
    seed: int = 0,
    obs_template: str = DEFAULT_OBS_TEMPLATE,
    native_tools: bool = False,
    tool_prompt: str = "hermes",
) -> tuple[list[dict], list[dict], list[dict]]:
    """(train rows, held-out eval rows, SFT rows); deterministic in ``seed``;
    ``native_tools``: for native tool calls (module doc), the demonstrations' tool block
    ``tool_prompt`` (``chat.render.TOOL_PROMPTS``)."""
    if num_demos > num_train:
        raise ValueError(
            f"num_demos={num_demos} must be <= num_train={num_train} "
            "(demonstrations are drawn from the training split)"
        )
    rng = random.Random(seed)
    eval_pairs = sample_pairs(num_eval, digits, rng)
    train_pairs = sample_pairs(num_train, digits, rng, exclude=set(eval_pairs))
    train = [make_row(a, b, i, "train", native_tools) for i, (a, b) in enumerate(train_pairs)]
    evals = [make_row(a, b, i, "eval", native_tools) for i, (a, b) in enumerate(eval_pairs)]
    if native_tools:
        demos = [native_demonstration(row, tool_prompt) for row in train[:num_demos]]
        return train, evals, demos
    sft = []
    for row in train[:num_demos]:
        a, b = row["extra_info"]["a"], row["extra_info"]["b"]
        sft.append({**row, "response_segments": demonstration_segments(a, b, obs_template)})
    return train, evals, sft


def write_task(
    out_dir: str | os.PathLike,
    num_train: int,
    num_eval: int,
    num_demos: int,
    digits: Sequence[int] = (4,),
    seed: int = 0,
    obs_template: str = DEFAULT_OBS_TEMPLATE,
    native_tools: bool = False,
    tool_prompt: str = "hermes",
) -> TaskFiles:
    """Generate the task and write ``train/eval/sft.parquet`` under ``out_dir``."""
    train, evals, sft = generate(
        num_train, num_eval, num_demos, digits, seed, obs_template, native_tools, tool_prompt
    )
    out = Path(out_dir)
    return TaskFiles(
        train=write_rows(train, out / "train.parquet"),
        eval=write_rows(evals, out / "eval.parquet"),
        sft=write_rows(sft, out / "sft.parquet"),
    )


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """``write_task`` with the sizes of ``config.task``, ``config.rollout.obs_template``
    and the tool block of the native tool calls in use: the gateway's
    (``gateway.tool_prompt``) or our agent loop's (``rollout.tool_prompt``)."""
    t = config.task
    r = config.rollout
    gateway = r.producer == "gateway"  # the program decides how it calls the tool
    if not gateway and t.native_tools != r.native:
        raise ValueError(
            f"task.native_tools={t.native_tools} writes prompts and demonstrations "
            f"{'for' if t.native_tools else 'without'} native tool calls, but "
            f"rollout.tool_format={r.tool_format!r}: set "
            f"rollout.tool_format={'hermes' if t.native_tools else 'tags'!r} or "
            f"task.native_tools={not t.native_tools}"
        )
    if t.native_tools and not gateway and r.tool_format != "hermes":
        raise ValueError(
            f"task.native_tools demonstrates Hermes calls; set rollout.tool_format='hermes' "
            f"(got {r.tool_format!r})"
        )
    return write_task(
        out_dir,
        t.num_train,
        t.num_eval,
        t.num_demos,
        tuple(t.digits),
        t.seed,
        config.rollout.obs_template,
        t.native_tools,
        config.gateway.tool_prompt if gateway else r.tool_prompt,
    )


TASK_CONFIG = TinyMathTask
