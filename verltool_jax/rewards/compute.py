"""Scoring many responses in parallel, off the event loop, with a per-item timeout.

``RewardPool`` keeps ``num_workers`` spawned processes (a ``ProcessPoolExecutor``). Each
item is scored by its reward function under a SIGALRM timer of ``timeout_s`` inside the
worker (which stops a runaway sympy simplification); if a worker is stuck beyond that (in
C code), the batch deadline ``timeout_s * ceil(n / num_workers) + grace_s`` passes, the
pool is killed and restarted, and every unfinished item scores 0 with
``info["timeout"] = True``. A worker that dies (killed, out of memory) breaks the pool at
once: its unfinished items score 0 with ``info["killed"] = True`` and the next batch gets
a fresh pool. (``multiprocessing.Pool`` is not used: a worker killed while it waits for
work dies holding the task queue's lock, and the pool's ``terminate`` then waits for that
lock forever.)
An exception in a reward function scores 0 with ``info["error"]``; it never stops training.
Workers warm the math verifier up when they start (``warm_up``), so a first LaTeX parse
(seconds) does not eat an item's timeout. ``num_workers=0`` scores in the calling process (the timer then works only in the main
thread). ``score_async`` runs a batch in a thread so the asyncio loop keeps going.
With a ``judge`` (config ``reward.judge``, :mod:`verltool_jax.rewards.judge`), the batch's
rule-based results are then graded by the judge model in this process (its cache and
client shared by all items) and blended in before shaping.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import importlib
import math
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verltool_jax.rewards.base import (
    RewardResult,
    get_reward_fn,
    resolve_reward_name,
    reward_plugins,
)
from verltool_jax.rewards.env_reward import PROGRAM_REWARD
from verltool_jax.rewards.shaping import ShapingSettings, shaped_score
from verltool_jax.rollout.response_text import model_text

if TYPE_CHECKING:
    from verltool_jax.rewards.judge import Judge


@dataclass
class RewardItem:
    """What one scoring needs (picklable)."""

    text: str
    ground_truth: Any
    reward_name: str
    extra_info: dict = field(default_factory=dict)
    tool_calls: int = 0
    invalid_tool_calls: int = 0


class _Timeout(BaseException):
    """Raised by the item timer; a BaseException so ``except Exception`` cannot swallow it."""


def _on_alarm(signum, frame):
    raise _Timeout()


def score_item(item: RewardItem, timeout_s: float, shaping: ShapingSettings) -> RewardResult:
    """Score one item (timer only in a main thread); shaping applied; never raises."""
    use_alarm = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGALRM, _on_alarm) if use_alarm else None
    t0 = time.perf_counter()
    try:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        base = get_reward_fn(item.reward_name)(item.text, item.ground_truth, item.extra_info)
    except _Timeout:
        base = RewardResult(0.0, False, {"timeout": True})
    except Exception as e:
        base = RewardResult(0.0, False, {"error": f"{type(e).__name__}: {e}"})
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    info = dict(
        base.info,
        reward_name=item.reward_name,
        base_score=base.score,
        seconds=round(time.perf_counter() - t0, 4),
    )
    score = shaped_score(base, shaping, item.tool_calls, item.invalid_tool_calls)
    return RewardResult(score, base.correct, info)


_INIT_ERROR: str | None = None


def _init_worker(modules: Sequence[str], warm: bool) -> None:
    global _INIT_ERROR
    try:
        import math_verify  # noqa: F401  never imported lazily under an item's timer

        import verltool_jax.rewards  # noqa: F401  registers the built-in rewards

        reward_plugins()  # installed packages' rewards, imported before any item's timer

        if warm:
            from verltool_jax.rewards.math_reward import warm_up

            warm_up()
        for m in modules:
            importlib.import_module(m)
    except Exception as e:
        _INIT_ERROR = f"{type(e).__name__}: {e}"


def _ping(_: int) -> str | None:
    return _INIT_ERROR


def _worker_score(args) -> RewardResult:
    return score_item(*args)


def make_item(
    row: dict,
    text: str,
    reward_name: str = "",
    tool_calls: int = 0,
    invalid_tool_calls: int = 0,
    tool_rewards: Sequence[float] | None = None,
) -> RewardItem:
    """A RewardItem from a verl-layout row and the response text; ``tool_rewards`` (the
    rewards the tools returned, in order) go to the reward as ``extra_info["tool_rewards"]``."""
    try:
        gt = row["reward_model"]["ground_truth"]
        ds = row["data_source"]
    except (KeyError, TypeError):
        raise ValueError(
            "a reward needs the data row with 'data_source' and 'reward_model.ground_truth'"
        ) from None
    return RewardItem(
        text=text,
        ground_truth=gt,
        reward_name=resolve_reward_name(ds, reward_name),
        extra_info=dict(row.get("extra_info") or {})
        | ({} if tool_rewards is None else {"tool_rewards": [float(r) for r in tool_rewards]}),
        tool_calls=tool_calls,
        invalid_tool_calls=invalid_tool_calls,
    )


def items_from(entries: Iterable[Any], tokenizer=None, reward_name: str = "") -> list[RewardItem]:
    """RewardItems from Trajectory objects (needs ``tokenizer``) or (text, row) pairs."""
    out = []
    for e in entries:
        if isinstance(e, RewardItem):
            out.append(e)
        elif isinstance(e, tuple) and len(e) == 2:
            out.append(make_item(e[1], e[0], reward_name))
        elif hasattr(e, "response_ids") and hasattr(e, "data"):
            if tokenizer is None:
                raise ValueError("scoring Trajectory objects needs the tokenizer")
            text = model_text(e.response_ids, e.loss_mask, tokenizer)
            rewards = [
                x["reward"]
                for x in getattr(e, "extras", ())
                if isinstance(x.get("reward"), (int, float)) and not isinstance(x["reward"], bool)
            ]
            item = make_item(
                e.data, text, reward_name, e.tool_calls, e.invalid_tool_calls, rewards or None
            )
            program = (getattr(e, "reward_info", None) or {}).get("program_reward")
            if program is not None:  # an agent program's reward (gateway), for program_reward
                item.extra_info[PROGRAM_REWARD] = float(program)
            out.append(item)
        else:
            raise TypeError(
                f"cannot score a {type(e).__name__}; pass Trajectory objects, "
                "(text, row) pairs or RewardItems"
            )
    return out


class RewardPool:
    """Parallel scoring with timeouts (see the module doc). Use as a context manager."""

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        shaping: ShapingSettings = ShapingSettings(),
        reward_name: str = "",
        reward_modules: Sequence[str] = (),
        grace_s: float = 5.0,
        startup_timeout_s: float = 120.0,
        warm_up: bool = True,
        judge: Judge | None = None,
    ):
        if num_workers < 0 or timeout_s <= 0:
            raise ValueError(
                f"need num_workers >= 0 and timeout_s > 0, got {num_workers}, {timeout_s}"
            )
        self.num_workers, self.timeout_s, self.grace_s = num_workers, timeout_s, grace_s
        self.startup_timeout_s, self.warm_up = startup_timeout_s, warm_up
        self.shaping, self.reward_name = shaping, reward_name
        self.reward_modules = tuple(reward_modules)
        self.restarts = 0
        self.judge = judge
        self._pool: cf.ProcessPoolExecutor | None = None
        reward_plugins()  # installed packages' rewards, here as in every worker
        for m in self.reward_modules:
            importlib.import_module(m)

    @classmethod
    def from_config(cls, reward_cfg) -> RewardPool:
        """From the config's ``reward`` section (see configs/base.py); ``reward.judge``
        with a backend adds the judge (a sampler judge loads its model here)."""
        from verltool_jax.rewards.judge import Judge

        return cls(
            num_workers=reward_cfg.num_workers,
            timeout_s=reward_cfg.timeout_s,
            shaping=ShapingSettings(
                reward_cfg.format_penalty,
                reward_cfg.tool_use_bonus,
                reward_cfg.invalid_tool_penalty,
                reward_cfg.valid_tool_call_bonus,
            ),
            reward_name=reward_cfg.name,
            judge=Judge.from_config(reward_cfg.judge),
        )

    def _ensure_pool(self) -> cf.ProcessPoolExecutor | None:
        if self._pool is None and self.num_workers > 0:
            ctx = mp.get_context("spawn")  # never fork a process that runs JAX threads
            self._pool = cf.ProcessPoolExecutor(
                self.num_workers,
                mp_context=ctx,
                initializer=_init_worker,
                initargs=(self.reward_modules, self.warm_up),
            )
            # Wait until the workers have imported the rewards, so that start-up time
            # (seconds, for sympy) never counts against a batch's deadline.
            pings = [self._pool.submit(_ping, i) for i in range(self.num_workers)]
            done, _ = cf.wait(pings, timeout=self.startup_timeout_s)
            errors: list[str | None]
            if len(done) < len(pings):
                errors = [
                    f"no worker answered within {self.startup_timeout_s}s (a script "
                    "that starts a RewardPool needs the if __name__ == '__main__': "
                    "guard, and cannot be run from stdin)"
                ]
            else:
                errors = [
                    f"{type(f.exception()).__name__}: {f.exception()}"
                    if f.exception() is not None
                    else f.result()
                    for f in pings
                ]
            failed = [e for e in errors if e]
            if failed:
                self.close()
                raise RuntimeError(f"reward workers failed to start: {failed[0]}")
        return self._pool

    def worker_pids(self) -> list[int]:
        """PIDs of the worker processes now (empty before the first batch)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return sorted(int(p.pid) for p in procs.values() if p.pid is not None)

    def score(self, entries: Iterable[Any], tokenizer=None) -> list[RewardResult]:
        """Score Trajectory objects, (text, row) pairs or RewardItems, in order (then the
        judge, if any: ``JudgeError`` when it fails and ``reward.judge.on_error="error"``)."""
        items = items_from(entries, tokenizer, self.reward_name)
        if not items:
            return []
        results = self._score_rules(items)
        if self.judge is not None:
            results = self.judge.rescore(items, results, self.shaping)
        return results

    def _score_rules(self, items: list[RewardItem]) -> list[RewardResult]:
        pool = self._ensure_pool()
        if pool is None:
            return [score_item(it, self.timeout_s, self.shaping) for it in items]
        try:
            pending = [
                pool.submit(_worker_score, (it, self.timeout_s, self.shaping)) for it in items
            ]
        except cf.BrokenExecutor:  # a worker died since the last batch: a fresh pool
            self._replace_pool()
            return self._score_rules(items)
        deadline = (
            time.monotonic()
            + self.grace_s
            + self.timeout_s * math.ceil(len(items) / self.num_workers)
        )
        results: list[RewardResult] = []
        failed = False
        for it, f in zip(items, pending):
            try:
                results.append(f.result(timeout=max(0.0, deadline - time.monotonic())))
            except (cf.TimeoutError, cf.BrokenExecutor) as e:
                # stuck past its own timer (timeout), or its worker died (broken pool)
                failed = True
                info = {"killed": True, "reward_name": it.reward_name}
                if isinstance(e, cf.TimeoutError):
                    info["timeout"] = True
                results.append(RewardResult(0.0, False, info))
        if failed:  # kill and replace the pool
            self._replace_pool()
        return results

    def _replace_pool(self) -> None:
        """Kill the workers (a wedged one would never end) and drop the pool; the next
        batch starts a fresh one."""
        self._kill_pool()
        self.restarts += 1

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for proc in procs:
            try:
                proc.kill()
            except (OSError, ValueError):
                pass
        pool.shutdown(wait=True, cancel_futures=True)

    async def score_async(self, entries: Iterable[Any], tokenizer=None) -> list[RewardResult]:
        """``score`` in a worker thread, so the event loop is never blocked."""
        return await asyncio.to_thread(self.score, list(entries), tokenizer)

    def close(self) -> None:
        if self.judge is not None:
            self.judge.close()
            self.judge = None
        self._kill_pool()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def score_episodes(pool: RewardPool, trajs: Sequence[Any], tokenizer: Any, rule: str) -> None:
    """Rewards of ``trajs`` in place: each episode scored once by the verifier (the reward
    pool) on the join of its pieces, combined with the program's reward by ``rule``
    (``combine_reward``), the same for all its pieces. With no gateway trajectories
    and ``rule="verifier"`` this is the pool's score of every trajectory, unchanged.
    ``reward_info`` keeps ``program_reward``; a piece whose rule finds no reward becomes
    an error record (not trained on, counted by the health monitor). Rules and the
    episode bookkeeping: ``verltool_jax/gateway/program.py``."""
    from verltool_jax.gateway.program import NO_PROGRAM_REWARD, combine_reward, episodes, joined

    groups = episodes(trajs)
    program = [(trajs[g[0]].reward_info or {}).get("program_reward") for g in groups]
    results = await pool.score_async([joined([trajs[i] for i in g]) for g in groups], tokenizer)
    for g, res, p in zip(groups, results, program):
        rows = [trajs[i] for i in g]
        assign_rewards(rows, [res] * len(rows))
        r = combine_reward(rule, res.score, p)
        for t in rows:
            if p is not None:
                t.reward_info["program_reward"] = p
            if r is None and t.termination != "error":
                t.termination, t.error = "error", NO_PROGRAM_REWARD
            t.reward = 0.0 if r is None else r


def compute_rewards(
    entries: Iterable[Any],
    tokenizer=None,
    *,
    num_workers: int = 2,
    timeout_s: float = 10.0,
    shaping: ShapingSettings = ShapingSettings(),
    reward_name: str = "",
) -> list[RewardResult]:
    """One-off parallel scoring (a pool is started and closed; reuse ``RewardPool`` in loops)."""
    with RewardPool(num_workers, timeout_s, shaping, reward_name) as pool:
        return pool.score(entries, tokenizer)


def assign_rewards(trajectories: Sequence[Any], results: Sequence[RewardResult]) -> None:
    """Write each result into its Trajectory: ``reward``, ``reward_info`` (with ``acc``)."""
    if len(trajectories) != len(results):
        raise ValueError(f"{len(trajectories)} trajectories but {len(results)} results")
    for t, r in zip(trajectories, results):
        t.reward = r.score
        t.reward_info = dict(r.info, acc=float(r.correct))
