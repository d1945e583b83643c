"""A verifiers taskset for the tests (tests/environments/test_verifiers_env.py): short
prompts and a rubric whose score depends on every character of the reply
(``reply_scores.py``), so that a test can check that the reward a trajectory was trained
with is the rubric's score of exactly the text the gateway recorded. Two weighted
rewards, which verifiers sums."""

from __future__ import annotations

import verifiers.v1 as vf
from reply_scores import DIGITS_WEIGHT, LENGTH_WEIGHT, digits_score, length_score


class LengthTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=LENGTH_WEIGHT)
    async def length(self, trace: vf.Trace) -> float:
        return length_score(trace.last_reply)

    @vf.reward(weight=DIGITS_WEIGHT)
    async def digits(self, trace: vf.Trace) -> float:
        return digits_score(trace.last_reply)


class LengthConfig(vf.TasksetConfig):
    num_tasks: int = 8


class LengthTaskset(vf.Taskset[LengthTask, LengthConfig]):
    def load(self) -> list[LengthTask]:
        return [
            LengthTask(
                vf.TaskData(id=f"q{i}", prompt=f"What is {i} + {i}?", system_prompt="Be brief."),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]


__all__ = ["LengthTaskset"]
