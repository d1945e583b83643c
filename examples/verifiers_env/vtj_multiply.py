"""A verifiers environment (verifiers 0.4's ``verifiers.v1`` API) that our trainer trains
on through the gateway (docs/environments.md): multiply two numbers, answer as
``<answer>N</answer>``; the reward is 1.0 for the right product, else 0.0.

The problems are made in code from ``seed`` (no data set to download), like tiny_math's;
the factors have ``digits`` digits. It is a plain taskset, so verifiers plays it with
the harness its run names (our runner: verifiers' own chat program, the ``null``
harness). Load it as verifiers does, by module name, with this folder on ``sys.path``::

    vf.load_taskset(vf.TasksetConfig(id="vtj_multiply"))

It runs only in the verifiers virtual environment (scripts/setup.sh builds it).
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

SYSTEM_PROMPT = "Answer as <answer>number</answer>."
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


class MultiplyData(vf.TaskData):
    """One problem: the prompt asks for ``a * b``; ``answer`` is the product."""

    a: int
    b: int
    answer: int


class MultiplyTask(vf.Task[MultiplyData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        """1.0 when the last reply's last ``<answer>`` is the product."""
        found = ANSWER.findall(trace.last_reply)
        return 1.0 if found and int(found[-1]) == self.data.answer else 0.0


class MultiplyConfig(vf.TasksetConfig):
    num_tasks: int = 64
    digits: int = 1
    seed: int = 0


class MultiplyTaskset(vf.Taskset[MultiplyTask, MultiplyConfig]):
    def load(self) -> list[MultiplyTask]:
        rng = random.Random(self.config.seed)
        lo, hi = 10 ** (self.config.digits - 1), 10**self.config.digits - 1
        tasks = []
        for i in range(self.config.num_tasks):
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            data = MultiplyData(
                id=f"mul-{i}",
                prompt=f"What is {a} * {b}?",
                system_prompt=SYSTEM_PROMPT,
                a=a,
                b=b,
                answer=a * b,
            )
            tasks.append(MultiplyTask(data, self.config.task))
        return tasks


__all__ = ["MultiplyTaskset"]
