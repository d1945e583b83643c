"""Asynchronous rollout: one asyncio task per trajectory.

Each trajectory asks the sampler for its next turn, and the moment that turn ends on an
action it sends exactly that turn's text to the tool server, appends the observation
(tokenized on its own, truncated in tokens, loss mask 0) and goes on, never waiting for
the rest of the batch. With a native tool-call format (``rollout.tool_format``) each call
of the reply is sent in turn and the observation is the chat template's tool turn
(``rollout/native.py``). An error in one trajectory (tool server down, sampler error)
ends that trajectory with ``termination="error"``; the others go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tool_server.client import ToolClient
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.final_check import final_check
from verltool_jax.rollout.observation import ObservationFormatter
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.rollout.turns import TrajectoryBuilder
from verltool_jax.samplers.base import Sampler


@dataclass
class PromptItem:
    """One prompt: its token ids, the data row (ground truth, extra_fields, ...), a group id,
    and its images (``ImageInput``, in the order of their placeholder runs in ``prompt_ids``)."""

    prompt_ids: list[int]
    data: dict = field(default_factory=dict)
    group_id: str | None = None
    images: list = field(default_factory=list)

    def gid(self) -> str:
        """``group_id``, which a rollout needs (:func:`as_prompt_item` sets it)."""
        if self.group_id is None:
            raise ValueError(
                "PromptItem.group_id is None; set it, or build the item with as_prompt_item "
                "(which names the group g<index>)"
            )
        return self.group_id


PromptLike = PromptItem | Sequence[int] | dict


def as_prompt_item(p: PromptLike, index: int) -> PromptItem:
    """Accept a PromptItem, a list of token ids, or a dict with ``prompt_ids``."""
    if isinstance(p, PromptItem):
        item = p
    elif isinstance(p, dict):
        if "prompt_ids" not in p:
            raise ValueError(
                f"prompt {index}: a dict prompt needs 'prompt_ids' (token ids); "
                f"got keys {sorted(p)}"
            )
        item = PromptItem(
            list(p["prompt_ids"]),
            dict(p.get("data", {})),
            p.get("group_id"),
            list(p.get("images") or []),
        )
    else:
        item = PromptItem(list(p))
    if not item.prompt_ids or not all(isinstance(t, int) for t in item.prompt_ids):
        raise ValueError(f"prompt {index}: prompt_ids must be a non-empty list of ints")
    if item.group_id is None:
        item.group_id = f"g{index}"
    return item


def make_formatter(
    tokenizer: Any, cfg: RolloutConfig, image_processor: Any = None
) -> ObservationFormatter:
    """The observation formatter of ``cfg``; ``image_processor`` for vision-language policies."""
    return ObservationFormatter(
        tokenizer,
        cfg.obs_template,
        cfg.max_obs_tokens,
        cfg.obs_truncate_side,
        cfg.obs_truncate_marker,
        image_processor,
    )


async def rollout_trajectory(
    builder: TrajectoryBuilder, sampler: Sampler, tool_client: ToolClient
) -> Trajectory:
    """Run one trajectory to its end; never raises (errors end it with "error")."""
    t0 = time.perf_counter()
    tid = builder.traj.trajectory_id
    try:
        while True:
            action = builder.pending_action  # set when resumed in the middle of a tool call
            if action is None:
                req = builder.request()
                if req is None:
                    break
                ids, params = req
                g0 = time.perf_counter()
                comp = await builder.generate(sampler, ids, params)
                action = builder.apply_completion(comp, time.perf_counter() - g0)
                if action is None:  # ended, or (native calls) answered without the server
                    if builder.finished:
                        break
                    continue
            extra = builder.extra_field | (builder.resumed or {})
            res = await tool_client.get_observation(
                tid, action, extra, is_last_step=builder.is_last_tool_turn
            )
            builder.resumed = None
            builder.apply_observation(res)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        builder.fail(f"{type(e).__name__}: {e}")
    checked = await final_check(builder, tool_client)
    if builder.traj.tool_calls or builder.pending_action is not None or checked:
        try:
            await tool_client.finish(tid)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            builder.traj.data.setdefault("finish_error", f"{type(e).__name__}: {e}")
    builder.traj.wall_time_s += time.perf_counter() - t0  # resumed: its earlier time too
    return builder.traj


async def rollout_group(
    item: PromptItem,
    n_samples: int,
    sampler: Sampler,
    tool_client: ToolClient,
    tokenizer: Any,
    cfg: RolloutConfig,
    formatter: ObservationFormatter | None = None,
    semaphore: asyncio.Semaphore | None = None,
) -> list[Trajectory]:
    """Roll out ``n_samples`` trajectories of one prompt concurrently; return the group."""
    formatter = formatter or make_formatter(tokenizer, cfg)

    async def one(k: int) -> Trajectory:
        b = item_builder(item, f"{item.group_id}-{k}", cfg, tokenizer, formatter)
        return await rollout_bounded(b, sampler, tool_client, semaphore)

    return list(await asyncio.gather(*(one(k) for k in range(n_samples))))


def item_builder(
    item: PromptItem,
    trajectory_id: str,
    cfg: RolloutConfig,
    tokenizer: Any,
    formatter: ObservationFormatter,
) -> TrajectoryBuilder:
    """A fresh builder of one trajectory of ``item``'s group."""
    return TrajectoryBuilder(
        trajectory_id, item.gid(), item.prompt_ids, cfg, tokenizer, formatter, item.data,
        item.images,
    )  # fmt: skip


async def rollout_bounded(
    builder: TrajectoryBuilder,
    sampler: Sampler,
    tool_client: ToolClient,
    semaphore: asyncio.Semaphore | None = None,
) -> Trajectory:
    """:func:`rollout_trajectory` holding ``semaphore`` (``rollout.max_concurrency``)."""
    if semaphore is None:
        return await rollout_trajectory(builder, sampler, tool_client)
    async with semaphore:
        return await rollout_trajectory(builder, sampler, tool_client)


async def run_rollout(
    prompts: Sequence[PromptLike],
    n_samples: int,
    sampler: Sampler,
    tool_client: ToolClient,
    tokenizer: Any,
    cfg: RolloutConfig,
    image_processor: Any = None,
    on_group: Callable[[list[Trajectory]], None] | None = None,
) -> list[list[Trajectory]]:
    """Roll out a fixed list of prompts ``n_samples`` times each, every trajectory its own
    task (at most ``cfg.max_concurrency`` at once); returns the groups in prompt order,
    calling ``on_group(group)`` as each group ends (a progress bar).
    (Evaluation and one-off rollouts; training goes through ``rollout.producer``.)"""
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    items = [as_prompt_item(p, i) for i, p in enumerate(prompts)]
    gids = [it.group_id for it in items]
    if len(set(gids)) != len(gids):
        raise ValueError("prompts have duplicate group_id values; each prompt needs its own")
    formatter = make_formatter(tokenizer, cfg, image_processor)
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None

    async def one(it: PromptItem) -> list[Trajectory]:
        group = await rollout_group(
            it, n_samples, sampler, tool_client, tokenizer, cfg, formatter, sem
        )
        if on_group is not None:
            on_group(group)
        return group

    return list(await asyncio.gather(*(one(it) for it in items)))
