"""Rollout groups from an agent program through the gateway.

``gateway_group`` runs ``n_samples`` episodes of one prompt: each gets its own trajectory
key, the agent program is called with that key's base URL and the data row, and when it
returns the episode is ended (its return value, if a number, is the program's reward).
An episode whose program raised, or that the gateway dropped (timeout, sampler failure),
gives one trajectory with ``termination="error"`` and no response tokens, which the
trainer counts and drops as it does the built-in loop's errors (``train/health.py``), and
is counted in ``gateway.stats["agent_failed"]``; a half-recorded episode is never kept. ``GatewayProducer`` is :class:`~verltool_jax.rollout.producer.RolloutProducer`
with its groups made this way (same queue, data position and resume behaviour).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from verltool_jax.rollout.agent_loop import PromptItem
from verltool_jax.rollout.producer import RolloutProducer
from verltool_jax.rollout.trajectory import Trajectory

from .server import ApiError, Gateway

log = logging.getLogger(__name__)

# agent(base_url, data_row) -> the program's reward or None; sync functions run in a thread
AgentProgram = Callable[[str, dict], Awaitable[Any] | Any]


GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1}  # the held-out evaluation's


async def run_episode(
    gateway: Gateway, agent: AgentProgram, item: PromptItem, sampling: dict | None = None
) -> list[Trajectory]:
    """One episode of ``agent`` (see module doc): its trajectories, or one error record.
    ``sampling``: fields fixed for its calls (default ``gateway.sampling``)."""
    group_id, data = item.gid(), dict(item.data)
    key = gateway.open_episode(group_id, data, sampling=sampling)

    def failed(reason: str) -> list[Trajectory]:
        gateway.stats["agent_failed"] += 1
        gateway.abort(key, reason)
        return [
            Trajectory(
                key, group_id, list(item.prompt_ids), termination="error", error=reason, data=data
            )
        ]

    try:
        if inspect.iscoroutinefunction(agent):
            out = await agent(gateway.url(key), data)
        else:
            out = await asyncio.to_thread(agent, gateway.url(key), data)
        reward = float(out) if isinstance(out, int | float) and not isinstance(out, bool) else None
    except Exception as e:  # the program crashed: its episode is not trained on
        log.warning("gateway: agent program failed on %s: %r", key, e)
        return failed(f"agent program raised {e!r}")
    if key in gateway.episodes:  # else the program ended it (POST /end) or it was dropped
        if not gateway.episodes[key].samples:
            return failed("the agent program made no call")
        try:
            gateway.end(key, reward)
        except ApiError as e:  # the program returned with a call still in flight
            return failed(str(e))
    try:
        trajs = await gateway.wait(key)
    except RuntimeError as e:  # dropped (timeout, sampler failure) or ended with no call
        return failed(f"the gateway dropped the episode: {e}")
    if reward is not None:  # returned after ending the episode itself: the return counts
        for t in trajs:
            t.reward, t.reward_info = reward, dict(t.reward_info, program_reward=reward)
    return trajs


async def gateway_group(
    gateway: Gateway, agent: AgentProgram, item: PromptItem, n_samples: int
) -> list[Trajectory]:
    """``n_samples`` concurrent episodes of one prompt, their trajectories in one list."""
    runs = [run_episode(gateway, agent, item) for _ in range(n_samples)]
    return [t for trajs in await asyncio.gather(*runs) for t in trajs]


class GatewayProducer(RolloutProducer):
    """A :class:`RolloutProducer` whose groups come from ``agent`` through ``gateway``
    (the sampler, tool client and formatter of the base class are not used)."""

    def __init__(
        self, prompts: Any, *, gateway: Gateway, agent: AgentProgram, **kwargs: Any
    ) -> None:
        kwargs.setdefault("sampler", gateway.sampler)
        kwargs.setdefault("tool_client", None)
        kwargs.setdefault("tokenizer", gateway.tokenizer)
        super().__init__(prompts, **kwargs)
        self.gateway = gateway
        self.agent = agent

    async def _group(self, item: PromptItem) -> list[Trajectory]:
        return await gateway_group(self.gateway, self.agent, item, self.n_samples)

    async def evaluate_items(self, items: list[PromptItem]) -> list[list[Trajectory]]:
        """One greedy episode of the program per held-out item (all concurrently): the
        pieces of each, or its error record (to be scored as training episodes are)."""
        runs = [run_episode(self.gateway, self.agent, it, sampling=GREEDY) for it in items]
        return list(await asyncio.gather(*runs))
