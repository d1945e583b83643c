"""What the step loop measures besides the train step's own metrics: the phases' wall
times (:class:`StepTimer`), the rollout batch (:func:`rollout_metrics`) and the
sampler-vs-trainer logprob parity on the trained trajectories (:func:`sampler_parity`)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from verltool_jax import metric_names as names
from verltool_jax.reporting.batch_summary import summarize
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.samplers.parity import token_parity
from verltool_jax.train import startup
from verltool_jax.train.batch import (
    PAD_MULTIPLE,
    batch_from_trajectories,
    prompt_group_size,
    row_images_of,
    shared_layout_pays,
)


class StepTimer:
    """Wall seconds of one RL step: each phase timed with :meth:`phase` (or given to
    :meth:`record`), and the whole step, from the end of the previous trained step."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.parts: dict[str, float] = {}
        self.spans: dict[str, tuple[float, float]] = {}  # (start, end) of each phase

    @contextmanager
    def phase(self, key: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spans[key] = (t0, time.perf_counter())
            self.parts[key] = self.spans[key][1] - t0

    def record(self, key: str, seconds: float) -> None:
        self.parts[key] = seconds

    def metrics(self, sampled_tokens: int) -> dict:
        """The phases, ``time/step_s`` and ``perf/tokens_per_s`` (sampled tokens of the
        step per wall second of the step), after the run's first step also the start-up
        split (``startup/*``, :mod:`verltool_jax.train.startup`); the next step's clock
        starts now."""
        now = time.perf_counter()
        wall = now - self.start
        out = dict(self.parts)
        clock = startup.active()
        if clock is not None and not clock.result:  # the first step of the run
            out.update(clock.first_step(self.start, self.spans))
        out[names.TIME_STEP] = wall
        out[names.TOKENS_PER_S] = sampled_tokens / max(1e-9, wall)
        self.start, self.parts, self.spans = now, {}, {}
        return out


def rollout_metrics(trajs: Sequence[Trajectory], version: int) -> dict:
    """``reporting.batch_summary.summarize`` of the batch under ``rollout/``, the mean reward and
    accuracy under their shared names, the mean staleness (versions between the one
    that started a trajectory and ``version``, the one trained) and the rollout errors."""
    stats = summarize(trajs, "rollout")
    stats.update(
        {
            names.REWARD: stats["rollout/reward"],
            names.ACC: stats["rollout/acc"],
            names.STALENESS: float(
                np.mean([version - t.min_version for t in trajs if t.min_version >= 0] or [0])
            ),
            names.ROLLOUT_ERRORS: sum(t.termination == "error" for t in trajs),
        }
    )
    return stats


def parity_batch(
    trajs: Sequence[Trajectory], pad_id: int, max_len: int, shared_prompt: str = "auto"
) -> tuple[dict, dict, int]:
    """``(batch, model_inputs, n)``: the rows of ``trajs`` as the parity pass scores them
    (``batch_from_trajectories``, zero advantages), the keywords the model takes besides
    ids and mask (images; a shared-prompt group's prefix) and the group size of the
    shared-prompt layout (0: plain rows), chosen as ``shared_prompt``
    (``trainer.shared_prompt``) says for the train batch. Response token j of row i is
    scored at target position ``response_start(trajs[i], n) + j``."""
    n = 0 if shared_prompt == "off" else prompt_group_size(trajs)
    if n and shared_prompt == "auto" and not shared_layout_pays(trajs, n):
        n = 0
    zeros = [0.0] * len(trajs)
    b = batch_from_trajectories(trajs, zeros, pad_id, max_len, PAD_MULTIPLE, group_size=n)
    positions, row_images = row_images_of(b)
    kw: dict[str, Any] = {}
    if row_images is not None:
        kw = {"positions": positions, "row_images": row_images}
    if n:
        kw = {"prefix": (b["prefix_ids"], b["prefix_mask"])}
    return b, kw, n


def response_start(t: Trajectory, n: int) -> int:
    """The target position of ``t``'s first response token in its :func:`parity_batch`
    row (a shared-prompt row holds the prompt's last token, then the response)."""
    return 0 if n else len(t.prompt_ids) - 1


def parity_picks(trajs: Sequence[Trajectory], version: int, n: int) -> list:
    """``(row, t, sampler_logprob)`` of every token that ``version`` sampled, in the
    :func:`parity_batch` rows of ``trajs`` (what :func:`samplers.parity.token_parity` takes)."""
    return [
        (i, response_start(t, n) + j, s)
        for i, t in enumerate(trajs)
        for j, (m, v, s) in enumerate(zip(t.loss_mask, t.versions, t.logprobs))
        if m and v == version
    ]


def parity_metrics(p: dict) -> dict:
    """``samplers.parity`` results under the logged names (``{}`` stays ``{}``)."""
    if not p:
        return {}
    return {
        names.PARITY_DIFF_MEAN: p["mean_abs_diff"],
        names.PARITY_DIFF_MAX: p["max_abs_diff"],
        names.PARITY_TOKENS: p["num_tokens"],
    }


def sampler_parity(
    model: Any,
    trajs: Sequence[Trajectory],
    version: int,
    temperature: float,
    pad_id: int,
    max_len: int,
    shared_prompt: str = "auto",
) -> dict:
    """``sync/logprob_diff_mean``, ``sync/logprob_diff_max``, ``sync/parity_tokens``:
    :func:`samplers.parity.token_parity` of the tokens that ``version`` sampled, the
    trainer's logprobs from ``model`` (the params of ``version``) on the batch rows of the
    trajectories (with the images the sampler saw, if any); ``{}`` when there is none.
    Groups with one prompt are scored in the shared-prompt layout as ``shared_prompt``
    (``trainer.shared_prompt``) says for the train batch."""
    trajs = [t for t in trajs if any(v == version for v in t.versions)]
    if not trajs:
        return {}
    b, kw, n = parity_batch(trajs, pad_id, max_len, shared_prompt)
    picks = parity_picks(trajs, version, n)
    p = token_parity(model, b["input_ids"], b["attention_mask"], picks, temperature, **kw)
    return parity_metrics(p)
