"""The server's core, independent of HTTP: routes each action to a tool, bounds
concurrency, enforces the per-call timeout, truncates observations and frees
per-trajectory state (on ``finish``, ``is_last_step``, ``done`` and after an idle TTL).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tool_server.kit.base import BaseTool, Observation, ToolSettings
from tool_server.kit.compat import VERLTOOL, verltool_invalid_observation, verltool_usage_block
from tool_server.kit.observations import (
    invalid_observation,
    normalize_observation,
    truncate_observation,
)
from tool_server.protocol import ObservationRequest, make_response

log = logging.getLogger("tool_server")

Step = tuple[Observation, bool, bool]

# Actions at least this long are parsed in a thread, off the event loop.
ROUTE_IN_THREAD_CHARS = 64 * 1024


class Dispatcher:
    """Runs requests against an ordered list of tool instances.

    Routing: the first tool (in the given order) whose ``parse_action`` accepts the
    action; an action none accepts is invalid (``done=False, valid=False``): only the
    request's ``finish`` flag ends a trajectory. With ``settings.compat == "verltool"``
    the answers follow VerlTool's server (:mod:`tool_server.kit.compat`).
    Concurrency: at most ``settings.max_concurrency`` tool calls in flight, and per tool
    ``tool.max_concurrency`` (or ``settings.tool_max_concurrency``). Sync
    ``conduct_action`` implementations run in a thread pool, async ones on the loop.
    Every call is cut off after ``settings.timeout_s`` with a timeout observation.
    Calls for the same trajectory within one request run in order; different
    trajectories run concurrently. Long actions are parsed in a thread. When the request
    is cancelled (its client disconnected) every call of it still waiting or running on
    the event loop is cancelled.
    """

    def __init__(self, tools: list[BaseTool], settings: ToolSettings) -> None:
        if not tools:
            raise ValueError("at least one tool is needed (--tools name1,name2)")
        self.tools = tools
        self.settings = settings
        self._global_sem = asyncio.Semaphore(settings.max_concurrency)
        self._tool_sem = {
            t.name: asyncio.Semaphore(t.max_concurrency or settings.tool_max_concurrency)
            for t in tools
        }
        self._is_async = {t.name: inspect.iscoroutinefunction(t.conduct_action) for t in tools}
        self._executor = ThreadPoolExecutor(
            max_workers=max(8, min(256, settings.max_concurrency)), thread_name_prefix="tool"
        )
        self._invalid_reason = "no tool accepted the action; tools: " + ", ".join(
            t.name for t in tools
        )
        self.verltool = settings.compat == VERLTOOL
        self._verltool_usage = verltool_usage_block(tools)
        # VerlTool's server with finish as its only tool hands it every action
        self._only_finish = all(t.name == "finish" for t in tools)
        self.started_at = time.monotonic()
        # requested tools that could not be loaded (a broken plugin): name -> reason
        self.unavailable_tools: dict[str, str] = {}
        self.in_flight = 0
        self.stats = {
            "requests": 0,
            "actions": 0,
            "invalid": 0,
            "timeouts": 0,
            "tool_errors": 0,
            "freed_by_ttl": 0,
        }
        self._sweeper: asyncio.Task | None = None

    # --- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        for t in self.tools:
            await t.astart()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for t in self.tools:
            try:
                await t.aclose()
            except Exception:  # shutdown must go on
                log.exception("closing tool %s failed", t.name)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- requests ------------------------------------------------------------------
    async def handle(self, req: ObservationRequest) -> dict:
        """Process one request; returns the response object (same order as ``req``)."""
        n = len(req)
        self.stats["requests"] += 1
        self.stats["actions"] += n
        obs: list[Any] = [None] * n
        dones = [False] * n
        valids = [False] * n

        async def one(i: int) -> None:
            extra = req.extra_fields[i]
            finish, last = req.finish[i], req.is_last_step[i]
            if self.verltool:  # VerlTool reads both flags from extra_fields when set there
                finish = bool(extra.get("finish", finish))
                last = bool(extra.get("is_last_step", last))
            obs[i], dones[i], valids[i] = await self.step(
                req.trajectory_ids[i], req.actions[i], extra, finish, last
            )

        groups: dict[str, list[int]] = {}
        for i, tid in enumerate(req.trajectory_ids):
            groups.setdefault(tid, []).append(i)
        if len(groups) == n:
            await asyncio.gather(*(one(i) for i in range(n)))
        else:

            async def in_order(idx: list[int]) -> None:
                for i in idx:
                    await one(i)

            await asyncio.gather(*(in_order(g) for g in groups.values()))
        return make_response(obs, dones, valids)

    def route(self, action: str) -> tuple[BaseTool | None, Any]:
        """The first tool whose parser accepts ``action`` and its parse (or ``(None, None)``).
        A parser that raises counts as not accepting."""
        for tool in self.tools:
            try:
                parsed, ok = tool.parse_action(action)
            except Exception:
                log.exception("parse_action of %s raised", tool.name)
                continue
            if ok:
                return tool, parsed
        return None, None

    async def step(self, tid: str, action: str, extra: dict, finish: bool, last: bool) -> Step:
        """One action of one trajectory -> ``(observation, done, valid)``."""
        if finish or (self.verltool and self._only_finish):
            self.free(tid)
            return "", True, True
        if len(action) >= ROUTE_IN_THREAD_CHARS:  # keep the event loop responsive
            tool, parsed = await asyncio.to_thread(self.route, action)
        else:
            tool, parsed = self.route(action)
        if tool is None:
            self.stats["invalid"] += 1
            if last:
                self.free(tid)
            if self.verltool:
                return verltool_invalid_observation(self._verltool_usage), False, False
            return invalid_observation(self._invalid_reason), False, False
        observation, done, valid = await self.call(tool, tid, parsed, extra)
        observation = normalize_observation(observation)
        if not self.verltool:  # VerlTool's server does not cut; its tools do
            observation = truncate_observation(observation, self.settings.max_obs_chars)
        if last or done:
            self.free(tid)
        return observation, bool(done), bool(valid)

    async def call(self, tool: BaseTool, tid: str, parsed: Any, extra: dict) -> Step:
        """``tool.conduct_action`` under the concurrency bounds and the timeout; a raise
        or a timeout becomes an observation (``valid=False``)."""
        timeout = self.settings.timeout_s
        async with self._global_sem, self._tool_sem[tool.name]:
            self.in_flight += 1
            try:
                if self._is_async[tool.name]:
                    aw = tool.conduct_action(tid, parsed, extra)
                else:
                    aw = asyncio.get_running_loop().run_in_executor(
                        self._executor, functools.partial(tool.conduct_action, tid, parsed, extra)
                    )
                result = await asyncio.wait_for(aw, timeout)
            except asyncio.TimeoutError:
                self.stats["timeouts"] += 1
                return (
                    invalid_observation(
                        "timeout", obs=f"Tool '{tool.name}' timed out after {timeout:g} s."
                    ),
                    False,
                    False,
                )
            except Exception as e:
                self.stats["tool_errors"] += 1
                log.exception("tool %s raised", tool.name)
                return (
                    invalid_observation(
                        "tool_error", obs=f"Tool '{tool.name}' failed: {type(e).__name__}: {e}"
                    ),
                    False,
                    False,
                )
            finally:
                self.in_flight -= 1
        if not (isinstance(result, tuple) and len(result) == 3):
            self.stats["tool_errors"] += 1
            return (
                invalid_observation(
                    "tool_error",
                    obs=f"Tool '{tool.name}' returned {type(result).__name__}, "
                    "expected (observation, done, valid)",
                ),
                False,
                False,
            )
        return result

    # --- state ---------------------------------------------------------------------
    def free(self, tid: str) -> None:
        """Free the trajectory's state in every tool."""
        for tool in self.tools:
            try:
                tool.delete_env(tid)
            except Exception:
                log.exception("freeing %s in %s failed", tid, tool.name)

    def sweep(self, now: float | None = None) -> int:
        """Free state idle longer than ``settings.state_ttl_s``; returns how many."""
        freed = 0
        for tool in self.tools:
            for tid in tool.expired(now):
                try:
                    tool.delete_env(tid)
                    freed += 1
                except Exception:
                    log.exception("freeing %s in %s failed", tid, tool.name)
        self.stats["freed_by_ttl"] += freed
        return freed

    async def _sweep_forever(self) -> None:
        interval = max(0.05, min(self.settings.sweep_interval_s, self.settings.state_ttl_s / 2))
        while True:
            await asyncio.sleep(interval)
            self.sweep()

    def live_trajectories(self) -> int:
        return len({tid for t in self.tools for tid in t.env})

    def health(self) -> dict:
        return {
            "status": "ok",
            "tools": [t.name for t in self.tools],
            "unavailable_tools": dict(self.unavailable_tools),
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "in_flight": self.in_flight,
            "live_trajectories": self.live_trajectories(),
            **self.stats,
        }
