"""One episode per trajectory key: the recorded calls, and the trajectories they become.

Each call appends to the current *sample* (a ``Trajectory`` in the making): the part of
the prompt that is new since the last call (tool results, the next user message, the
generation prompt) with loss mask 0, then the sampled completion with mask 1, the
sampler's logprobs and the policy version of every token. A call whose prompt does not
continue the sample (``render.continuation`` -> ``"break"``) closes it and opens a new
one with that prompt. ``finish`` turns the samples into ``Trajectory`` records; an episode
that failed (timed out, aborted, a call failed after recording started) yields none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.samplers.base import Completion


@dataclass
class Sample:
    prompt_ids: list[int]
    text: str  # text of prompt_ids + response_ids, for the splice check
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    num_turns: int = 0
    gen_tokens: list[int] = field(default_factory=list)
    gen_latencies: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


@dataclass
class Episode:
    key: str
    group_id: str
    data: dict[str, Any]
    created: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    raw_replies: dict[str, str] = field(default_factory=dict)  # call id / content -> raw text
    counts: dict[str, int] = field(
        default_factory=lambda: {"extend": 0, "splice": 0, "break": 0, "first": 0}
    )
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    in_flight: int = 0
    reward: float | None = None
    reward_info: dict = field(default_factory=dict)
    error: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # fixed sampling fields

    def record(
        self,
        kind: str,
        prompt_ids: list[int],
        prompt_text: str,
        comp: Completion,
        text: str,
        dt: float,
    ) -> None:
        """Add one call: ``kind`` is the continuation (``first`` for the first call),
        ``prompt_ids`` what the sampler was given, ``text`` the completion's text."""
        self.counts[kind] += 1
        if kind in ("first", "break"):
            self.samples.append(Sample(list(prompt_ids), prompt_text))
        s = self.samples[-1]
        new = prompt_ids[len(s.ids) :]
        if prompt_ids[: len(s.ids)] != s.ids:  # continuation() guarantees this
            raise AssertionError(f"episode {self.key}: a continued prompt lost its prefix")
        s.response_ids += new
        s.loss_mask += [0] * len(new)
        s.logprobs += [0.0] * len(new)
        s.versions += [-1] * len(new)
        n = len(comp.token_ids)
        s.response_ids += list(comp.token_ids)
        s.loss_mask += [1] * n
        s.logprobs += [float(x) for x in comp.logprobs]
        s.versions += comp.versions()
        s.text = prompt_text + text
        s.num_turns += 1
        s.gen_tokens.append(n)
        s.gen_latencies.append(dt)
        s.actions.append(text)
        self.last_active = time.monotonic()

    def trajectories(self) -> list[Trajectory]:
        """The samples as trajectories (every one carries the episode's reward)."""
        out = []
        for i, s in enumerate(self.samples):
            t = Trajectory(
                trajectory_id=self.key if i == 0 else f"{self.key}/{i}",
                group_id=self.group_id,
                prompt_ids=s.prompt_ids,
                response_ids=s.response_ids,
                loss_mask=s.loss_mask,
                logprobs=s.logprobs,
                versions=s.versions,
                num_turns=s.num_turns,
                tool_calls=self.tool_calls if i == 0 else 0,
                invalid_tool_calls=self.invalid_tool_calls if i == 0 else 0,
                termination="done",
                gen_latencies=s.gen_latencies,
                gen_tokens=s.gen_tokens,
                actions=s.actions,
                reward=self.reward,
                reward_info=dict(self.reward_info),
                data=dict(
                    self.data,
                    gateway_episode=self.key,
                    gateway_sample=i,
                    gateway_samples=len(self.samples),
                ),
                wall_time_s=time.monotonic() - self.created,
            )
            t.check()
            out.append(t)
        return out
