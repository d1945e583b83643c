"""Held-out evaluation: one greedy trajectory per prompt through the real tool server,
scored by the reward registry. Used by the trainer (after SFT, every ``eval_every``
steps, at the end) and by ``python -m verltool_jax.eval``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from verltool_jax import metric_names as names
from verltool_jax.reporting.batch_summary import summarize
from verltool_jax.rewards.compute import RewardPool, assign_rewards, score_episodes
from verltool_jax.rollout.agent_loop import PromptItem, run_rollout
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.train import multihost, startup
from verltool_jax.train.health import batch_health

log = logging.getLogger(__name__)


def prompt_item(example: Any, prefix: str) -> PromptItem:
    """A ``PromptExample`` as the rollout's ``PromptItem``, group id ``{prefix}{index}``."""
    return PromptItem(**example.to_prompt(f"{prefix}{example.index}"))


def prompt_items(examples: Sequence[Any], prefix: str) -> list[PromptItem]:
    return [prompt_item(e, prefix) for e in examples]


async def rollout_scored(
    sampler,
    items: Sequence[PromptItem],
    tool_client,
    tokenizer,
    rollout_cfg: RolloutConfig,
    reward_pool: RewardPool,
    n_samples: int = 1,
    temperature: float = 0.0,
    image_processor: Any = None,
    on_group: Callable[[list[Trajectory]], None] | None = None,
) -> list[list[Trajectory]]:
    """Every item rolled out ``n_samples`` times at ``temperature`` (0: greedy; top-p 1,
    no top-k) and scored; returns the groups in item order. ``image_processor``: a
    vision-language policy's (prompts / observations with images); ``on_group`` is
    called with each group as its rollout ends (a progress bar)."""
    cfg = dataclasses.replace(rollout_cfg, temperature=temperature, top_p=1.0, top_k=-1)
    groups = await run_rollout(
        list(items),
        n_samples,
        sampler,
        tool_client,
        tokenizer,
        cfg,
        image_processor=image_processor,
        on_group=on_group,
    )
    trajs = [t for g in groups for t in g]
    assign_rewards(trajs, await reward_pool.score_async(trajs, tokenizer))
    return groups


async def evaluate(
    sampler,
    items: Sequence[PromptItem],
    tool_client,
    tokenizer,
    rollout_cfg: RolloutConfig,
    reward_pool: RewardPool,
    prefix: str = "eval",
    image_processor: Any = None,
) -> tuple[dict, list[Trajectory]]:
    """Greedy (temperature 0) rollout of every item once; returns (metrics, trajectories)."""
    groups = await rollout_scored(
        sampler,
        items,
        tool_client,
        tokenizer,
        rollout_cfg,
        reward_pool,
        image_processor=image_processor,
    )
    trajs = [g[0] for g in groups]
    return summarize(trajs, prefix), trajs


async def evaluate_gateway(run: Any, producer: Any, items: list[PromptItem]) -> list[Trajectory]:
    """Held-out episodes of a ``GatewayProducer``'s agent program (greedy), each scored
    once as in training (``rewards.compute.score_episodes``); one trajectory per item,
    the episode's last piece."""
    episodes = await producer.evaluate_items(items)
    trajs = [t for ep in episodes for t in ep]
    await score_episodes(run.reward_pool, trajs, run.tokenizer, run.config.gateway.reward)
    return [ep[-1] for ep in episodes]


async def evaluate_run(
    run: Any, tool_client: Any, health: Any, version: int, tag: str, producer: Any = None
) -> tuple[dict, list[Trajectory]]:
    """The trainer's held-out evaluation of its current policy (``run``: a ``build.Run``):
    :func:`evaluate` of ``run.eval_items``, ``time/eval_s`` and ``eval/failed`` added,
    written at ``version`` and said on the console. Several processes each take a strided
    share of the items; the results are gathered in item order and summarised together.
    More failed trajectories than ``trainer.max_error_rate`` have ``health`` (a
    ``HealthMonitor``) check the dependencies (it raises if one is down for good).
    ``producer``: a ``GatewayProducer`` evaluates through its agent program instead."""
    rc = run.config
    if not run.eval_items:
        return {}, []
    t0 = time.perf_counter()
    items = run.eval_items[multihost.process_index() :: multihost.process_count()]
    if hasattr(producer, "evaluate_items"):
        trajs = await evaluate_gateway(run, producer, items)
        m = summarize(trajs, "eval")
    else:
        m, trajs = await evaluate(
            run.sampler,
            items,
            tool_client,
            run.tokenizer,
            rc.rollout.rollout_config(),
            run.reward_pool,
            image_processor=run.image_processor,
        )
    if multihost.is_multi():
        gathered = await asyncio.to_thread(multihost.gather_groups, [[t] for t in trajs])
        trajs = [g[0] for g in gathered]
        m = summarize(trajs, "eval")
    m[names.TIME_EVAL] = time.perf_counter() - t0
    startup.add("held-out evaluation", m[names.TIME_EVAL])  # before the first step
    h = batch_health(trajs)
    if h.rate > rc.trainer.max_error_rate:
        await health.check_dependencies(f"evaluation {tag}: {h.describe()}")
    m[names.EVAL_FAILED] = h.failed
    run.writer.write(version, m)
    log.info(
        f"[eval:{tag}] step {version}: held-out accuracy {m['eval/acc']:.3f} "
        f"(reward {m['eval/reward']:.3f}, tool calls {m['eval/tool_calls']:.2f}, "
        f"n={m['eval/num']}, {m['time/eval_s']:.1f}s"
        + (f", {h.failed} FAILED: {h.describe()})" if h.failed else ")")
    )
    return m, trajs
