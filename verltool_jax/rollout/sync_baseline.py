"""Batch-synchronous rollout, the baseline of the async-vs-sync ablation.

Turn k of every live trajectory is generated (one concurrent batch to the sampler); when
all of them are back, the batch's actions go to the tool server in one request; when
every observation is back, turn k+1 starts. Same records as the asynchronous loop (the
same :class:`TrajectoryBuilder`); only the schedule differs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from tool_server.client import ToolClient
from verltool_jax.rollout.agent_loop import PromptLike, as_prompt_item, make_formatter
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.final_check import final_check
from verltool_jax.rollout.queue import TrajectoryQueue
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.rollout.turns import TrajectoryBuilder
from verltool_jax.samplers.base import Sampler


async def _generate(b: TrajectoryBuilder, sampler: Sampler) -> str | None:
    if b.pending_action is not None:  # the next call of a native reply with several
        return b.pending_action
    req = b.request()
    if req is None:
        return None
    ids, params = req
    g0 = time.perf_counter()
    try:
        comp = await b.generate(sampler, ids, params)
        return b.apply_completion(comp, time.perf_counter() - g0)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        b.fail(f"{type(e).__name__}: {e}")
        return None


async def run_rollout_sync(
    prompts: Sequence[PromptLike],
    n_samples: int,
    sampler: Sampler,
    tool_client: ToolClient,
    tokenizer: Any,
    cfg: RolloutConfig,
    queue: TrajectoryQueue | None = None,
    formatter: Any | None = None,
) -> list[list[Trajectory]]:
    """Batch-synchronous rollout of every prompt ``n_samples`` times; groups in prompt order."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    items = [as_prompt_item(p, i) for i, p in enumerate(prompts)]
    formatter = formatter or make_formatter(tokenizer, cfg)
    t0 = time.perf_counter()
    builders = [
        [
            TrajectoryBuilder(
                f"{it.group_id}-{k}",
                it.gid(),
                it.prompt_ids,
                cfg,
                tokenizer,
                formatter,
                it.data,
                it.images,
            )
            for k in range(n_samples)
        ]
        for it in items
    ]
    flat = [b for g in builders for b in g]
    live = list(flat)
    while live:
        actions = await asyncio.gather(*(_generate(b, sampler) for b in live))
        acting = [(b, a) for b, a in zip(live, actions) if a is not None]
        if acting:
            try:
                results = await tool_client.get_observations(
                    [b.traj.trajectory_id for b, _ in acting],
                    [a for _, a in acting],
                    [b.extra_field for b, _ in acting],
                    is_last_step=[b.is_last_tool_turn for b, _ in acting],
                )
                for (b, _), r in zip(acting, results):
                    b.apply_observation(r)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                for b, _ in acting:
                    b.fail(f"{type(e).__name__}: {e}")
        now = time.perf_counter() - t0
        for b in live:
            if b.finished:
                b.traj.wall_time_s = now
        live = [b for b in live if not b.finished]
    checked = await asyncio.gather(*(final_check(b, tool_client) for b in flat))
    used = [
        b.traj.trajectory_id
        for b, c in zip(flat, checked)
        if b.traj.tool_calls or b.traj.actions or c
    ]
    if used:
        try:
            await tool_client.finish(used)
        except Exception as e:
            for b in flat:
                b.traj.data.setdefault("finish_error", f"{type(e).__name__}: {e}")
    groups = [[b.traj for b in g] for g in builders]
    if queue is not None:
        for g in groups:
            await queue.put_group(g)
    return groups
