"""The trainer's watch over what it depends on: the tool server, the sampler(s) and the
reward pool.

* :class:`ToolServerGuard` keeps the tool server reachable. A tool call that cannot
  connect (after the client's own retries) is handed to :meth:`ToolServerGuard.recover`:
  a server the trainer started is restarted (at most ``tool_server.max_restarts`` times)
  and the call is retried, so the turns in flight when it died are not lost; an
  external server (``tool_server.url``) is waited for ``tool_server.down_grace_s``
  seconds, and if it stays down the guard marks it down. The trainer also probes
  ``/health`` before every step (:meth:`ToolServerGuard.ensure`), so a server that died
  between tool calls is noticed too.
* :class:`HealthMonitor` judges each training batch: a trajectory *failed* if it ended
  in an error (tool server, sampler) or its reward scoring was killed (a reward worker
  died or wedged). A batch whose failed fraction exceeds ``trainer.max_error_rate`` is
  not trained on and not checkpointed; the monitor then looks for the cause and raises
  :class:`DependencyDown` if a dependency is down for good (an external tool server,
  a dead sampler), or after ``trainer.max_skipped_steps`` such batches in a row.

Failed trajectories of a batch under the threshold are left out of the update (their
reward says nothing about the policy).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tool_server.client import http_healthy
from verltool_jax import metric_names as names
from verltool_jax.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


class DependencyDown(RuntimeError):
    """A dependency of the run is down and could not be brought back; the message names
    it, and the last good checkpoint is kept (the same command resumes from it)."""


def trajectory_failed(t: Trajectory) -> bool:
    """True if ``t`` says nothing about the policy: its rollout ended in an error, or its
    reward scoring was killed (``reward_info["killed"]``)."""
    return t.termination == "error" or bool((t.reward_info or {}).get("killed"))


def failure_reason(t: Trajectory) -> str:
    if t.termination == "error":
        return t.error or "error"
    return "reward scoring killed (reward worker died or wedged)"


class ToolServerGuard:
    """Keeps one tool server reachable (see the module doc).

    ``process``: the :class:`~tool_server.launcher.ToolServerProcess` the trainer started
    (restartable), or None for an external server at ``url``.
    """

    def __init__(
        self,
        url: str,
        process: Any = None,
        *,
        max_restarts: int = 3,
        down_grace_s: float = 30.0,
        probe_every_s: float = 0.5,
    ) -> None:
        self.url = url
        self.process = process
        self.max_restarts = max_restarts
        self.down_grace_s = down_grace_s
        self.probe_every_s = probe_every_s
        self.restarts = 0
        self.down: str | None = None  # why the server is down for good
        self._clients: list = []
        self._lock: asyncio.Lock | None = None

    def watch(self, client: Any) -> Any:
        """Route ``client``'s unreachable-server failures here; return it."""
        client.on_unreachable = self.recover
        self._clients.append(client)
        return client

    async def healthy(self) -> bool:
        return await asyncio.to_thread(http_healthy, self.url)

    async def recover(self) -> bool:
        """Bring the server back if we can; True if it answers ``/health`` again."""
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:  # one restart for all the calls that failed
            if self.down is not None:
                return False
            if await self.healthy():
                return True
            if self.process is not None:
                return await self._restart()
            return await self._wait_for_external()

    async def _restart(self) -> bool:
        if self.restarts >= self.max_restarts:
            self.down = (
                f"the tool server the trainer started died again after "
                f"{self.restarts} restarts (tool_server.max_restarts="
                f"{self.max_restarts}); see run.log for its last output"
            )
            return False
        old = self.process.pid
        self.restarts += 1
        try:
            url = await asyncio.to_thread(self.process.restart)
        except Exception as e:
            self.down = f"the tool server the trainer started died and did not restart: {e}"
            return False
        if url != self.url:
            self.url = url
            for c in self._clients:
                c.url = url.rstrip("/")
        log.info(
            f"[health] the tool server (pid {old}) died; restarted it as pid "
            f"{self.process.pid} at {url} (restart {self.restarts}/{self.max_restarts}); "
            "the tool calls in flight are retried"
        )
        return True

    async def _wait_for_external(self) -> bool:
        log.info(
            f"[health] the tool server at {self.url} does not answer; waiting up to "
            f"{self.down_grace_s:g}s for it (tool_server.down_grace_s)"
        )
        deadline = time.monotonic() + self.down_grace_s
        while time.monotonic() < deadline:
            await asyncio.sleep(self.probe_every_s)
            if await self.healthy():
                log.info(f"[health] the tool server at {self.url} is back")
                return True
        self.down = (
            f"the tool server at {self.url} (tool_server.url) has been unreachable "
            f"for more than tool_server.down_grace_s={self.down_grace_s:g}s; start it "
            "again, then rerun the same command to resume from the last checkpoint"
        )
        return False

    async def ensure(self) -> None:
        """Raise :class:`DependencyDown` unless the server answers (after recovery)."""
        if self.down is None and await self.healthy():
            return
        if not await self.recover():
            raise DependencyDown(self.down)


def sampler_alive(sampler: Any) -> bool:
    """A sampler (or a pool of them) that can still serve requests."""
    if hasattr(sampler, "samplers") and hasattr(sampler, "healthy"):
        return any(ok and sampler_alive(s) for s, ok in zip(sampler.samplers, sampler.healthy))
    return bool(getattr(sampler, "alive", True))


def sampler_restarts(sampler: Any) -> int:
    """Engine restarts of a sampler (or of every sampler of a pool) so far."""
    if hasattr(sampler, "samplers"):
        return sum(sampler_restarts(s) for s in sampler.samplers)
    budget = getattr(sampler, "budget", None)
    return int(getattr(budget, "total", 0))


@dataclass
class BatchHealth:
    """One training batch's failures: how many, the fraction, the commonest reasons."""

    failed: int
    total: int
    rate: float
    reasons: list = field(default_factory=list)  # [(reason, count)], commonest first

    def describe(self) -> str:
        top = "; ".join(f"{n}x {r[:200]}" for r, n in self.reasons[:3])
        return f"{self.failed}/{self.total} trajectories failed ({top})"


def batch_health(trajs: Sequence[Trajectory]) -> BatchHealth:
    """Failed trajectories of a batch (:func:`trajectory_failed`), their fraction
    ``failed / total`` and their reasons counted."""
    bad = [t for t in trajs if trajectory_failed(t)]
    reasons = collections.Counter(failure_reason(t) for t in bad).most_common()
    return BatchHealth(len(bad), len(trajs), len(bad) / max(1, len(trajs)), reasons)


class HealthMonitor:
    """Decides whether a batch may be trained on, and stops the run when a dependency
    is down for good (see the module doc)."""

    def __init__(
        self,
        tool: ToolServerGuard,
        sampler: Callable[[], Any],
        reward_pool: Any,
        *,
        max_error_rate: float,
        max_skipped_steps: int,
    ) -> None:
        self.tool = tool
        self.sampler = sampler
        self.reward_pool = reward_pool
        self.max_error_rate = max_error_rate
        self.max_skipped_steps = max_skipped_steps
        self.skipped_in_a_row = 0
        self.skipped = 0

    async def before_step(self) -> None:
        """Probe the tool server (restarting / waiting as its guard does)."""
        await self.tool.ensure()

    async def admit(self, trajs: Sequence[Trajectory], step: int) -> bool:
        """True if the batch may be trained on. Otherwise the step is skipped: raise
        :class:`DependencyDown` if a dependency is down for good, or if this is more
        than ``max_skipped_steps`` skipped batches in a row."""
        h = batch_health(trajs)
        if h.rate <= self.max_error_rate:
            self.skipped_in_a_row = 0
            return True
        why = (
            f"step {step + 1}: {h.describe()}, more than trainer.max_error_rate="
            f"{self.max_error_rate:g}"
        )
        await self.check_dependencies(why + "; the batch was not trained on")
        self.skipped += 1
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row > self.max_skipped_steps:
            raise DependencyDown(
                f"{self.skipped_in_a_row} batches in a row failed ({why}); "
                f"stopping after trainer.max_skipped_steps="
                f"{self.max_skipped_steps}. The last good checkpoint is kept"
            )
        log.info(
            f"[health] {why}: not training on it, not checkpointing "
            f"({self.skipped_in_a_row}/{self.max_skipped_steps} skipped in a row)"
        )
        return False

    async def check_dependencies(self, why: str) -> None:
        """After failures (``why``): raise :class:`DependencyDown` if the sampler is dead
        or the tool server is down for good."""
        if not sampler_alive(self.sampler()):
            raise DependencyDown(
                f"the sampler died ({why}). See run.log for the engine's "
                "last output, then rerun the same command to resume from "
                "the last checkpoint"
            )
        await self.tool.ensure()

    def metrics(self) -> dict:
        return {
            names.HEALTH_SKIPPED_STEPS: self.skipped,
            names.HEALTH_TOOL_SERVER_RESTARTS: self.tool.restarts,
            names.HEALTH_SAMPLER_RESTARTS: sampler_restarts(self.sampler()),
            names.HEALTH_REWARD_POOL_RESTARTS: getattr(self.reward_pool, "restarts", 0),
        }
