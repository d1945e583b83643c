"""The server's core, independent of HTTP: routes each action to a tool, bounds
concurrency, enforces the per-call timeout, truncates observations and frees
per-trajectory state (on ``finish``, ``is_last_step``, ``done`` and after an idle TTL).

A trajectory resumed from a trainer's checkpoint (its call carries
``extra_fields[RESUMED_FIELD]``, see :mod:`tool_server.protocol`) keeps its tool state only
if this server still holds exactly the state its record reflects: the server counts each
trajectory's calls, and the count must equal the record's and every tool that keeps state
(``BaseTool.keeps_state``) and served one of its earlier actions must still hold it.
Otherwise (a restarted server, state freed by the TTL, calls made after the checkpoint)
its state is freed and the observation starts with :data:`RESET_NOTE`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from tool_server.kit.base import ActionResult, BaseTool, Observation, ToolSettings
from tool_server.kit.compat import VERLTOOL, verltool_invalid_observation, verltool_usage_block
from tool_server.kit.observations import (
    invalid_observation,
    normalize_observation,
    truncate_observation,
)
from tool_server.protocol import RESUMED_FIELD, ObservationRequest, make_response

log = logging.getLogger("tool_server")

Step = tuple[Observation, bool, bool]

# Actions at least this long are parsed in a thread, off the event loop.
ROUTE_IN_THREAD_CHARS = 64 * 1024
# What a resumed trajectory whose tool state is lost reads before its observation.
RESET_NOTE = (
    "[tool state was reset: this trajectory was paused at a checkpoint and resumed; what "
    "{tools} kept for it from its {n} earlier call(s) (variables, files, sessions) is "
    "gone. Run again what this call needs.]"
)


def with_note(observation: Observation, note: str) -> Observation:
    """``observation`` with ``note`` as its first line."""
    if isinstance(observation, dict):
        return dict(observation, obs=note + "\n" + str(observation.get("obs", "")))
    return note + "\n" + observation


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
            "states_reset": 0,  # resumed trajectories told their tool state was reset
        }
        self._calls: dict[str, tuple[int, float]] = {}  # trajectory -> (calls, last call)
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
        before = self._calls.get(tid, (0, 0.0))[0]
        self._calls[tid] = (before + 1, time.monotonic())
        note = None
        if RESUMED_FIELD in extra:
            resumed, extra = extra[RESUMED_FIELD], dict(extra)
            del extra[RESUMED_FIELD]  # ours, not the tools'
            note = await self.resumed_state(tid, resumed, extra, before)
        observation, done, valid = await self._step(tid, action, extra, last)
        return (observation if note is None else with_note(observation, note)), done, valid

    async def resumed_state(
        self, tid: str, resumed: dict, extra: dict, calls_before: int
    ) -> str | None:
        """The reset note for a resumed trajectory whose tool state is not the one its
        record (``resumed``: its ``tool_calls`` and earlier ``actions``) reflects, after
        freeing that state; None when it is intact or no tool it used keeps state."""
        actions = list(resumed["actions"])
        tools = await asyncio.to_thread(lambda: [self.route(a)[0] for a in actions])
        keeping = {t.name: t for t in tools if t is not None and t.keeps_state(extra)}
        if not keeping:
            return None
        if calls_before == resumed["tool_calls"] and all(tid in t.env for t in keeping.values()):
            return None  # this server kept it (e.g. it outlived the trainer)
        self.free(tid)
        self._calls[tid] = (1, time.monotonic())
        self.stats["states_reset"] += 1
        return RESET_NOTE.format(tools=", ".join(sorted(keeping)), n=len(actions))

    async def _step(self, tid: str, action: str, extra: dict, last: bool) -> Step:
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
                # _is_async tells which of the two kinds conduct_action is
                aw: Awaitable[ActionResult]
                if self._is_async[tool.name]:
                    aw = cast(Awaitable[ActionResult], tool.conduct_action(tid, parsed, extra))
                else:
                    run = cast(Callable[..., ActionResult], tool.conduct_action)
                    aw = asyncio.get_running_loop().run_in_executor(
                        self._executor, functools.partial(run, tid, parsed, extra)
                    )
                result = await asyncio.wait_for(aw, timeout)
            except TimeoutError:
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
        self._calls.pop(tid, None)
        for tool in self.tools:
            try:
                tool.delete_env(tid)
            except Exception:
                log.exception("freeing %s in %s failed", tid, tool.name)

    def sweep(self, now: float | None = None) -> int:
        """Free state idle longer than ``settings.state_ttl_s``; returns how many."""
        freed = 0
        now = time.monotonic() if now is None else now
        for tid, (_, last) in list(self._calls.items()):
            if now - last > self.settings.state_ttl_s:
                del self._calls[tid]
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
