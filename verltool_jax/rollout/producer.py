"""The rollout producer: the one place that turns prompts into trajectory groups for
training, in either mode.

* **async** (:meth:`RolloutProducer.run`): whenever the :class:`TrajectoryQueue` admits a
  group (``queue.admit()``: fewer than ``max_groups`` in flight, staleness bounded), the
  next prompt starts as its own group of ``n_samples`` trajectories, each its own asyncio
  task; the group goes into the queue the moment its last trajectory ends.
* **sync** (:meth:`RolloutProducer.next_groups`): the batch-synchronous baseline rolls out
  exactly the next ``k`` prompts, turn by turn in lock step, and returns them.

The producer draws its prompts through a :class:`~verltool_jax.rollout.ledger.PromptLedger`
(the data accounting): each prompt comes with a key (the trainer uses the data row's
index) and stays *in flight* until the consumer ends its group (:meth:`consumed`: trained;
``ledger.end`` for the other outcomes) or gives it back (:meth:`give_back`: rolled out
again, first); :meth:`in_flight_keys` is what a checkpoint must replay on resume. Prompts
given as ``replay`` (or waiting in a restored ledger) are started first; groups the
queue dropped as too stale are given back before each new start. :meth:`data_state` is
the checkpoint's data item: the ledger's with the trajectories in flight
(:mod:`verltool_jax.rollout.inflight`), which a resumed producer goes on with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

from verltool_jax.rollout.agent_loop import (
    PromptItem,
    item_builder,
    make_formatter,
    rollout_bounded,
)
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.inflight import InFlight, Slot, restore_group, snapshot
from verltool_jax.rollout.ledger import Entry, Keyed, PromptLedger
from verltool_jax.rollout.queue import QueueClosed, TrajectoryQueue
from verltool_jax.rollout.sync_baseline import run_rollout_sync
from verltool_jax.rollout.trajectory import Trajectory


class RolloutProducer:
    """Rolls out prompts from ``prompts`` (an iterator of ``(key, PromptItem)``; it may
    block, so it is advanced in a worker thread) ``n_samples`` times each."""

    def __init__(
        self,
        prompts: Iterator[Keyed],
        *,
        n_samples: int,
        sampler: Any,
        tool_client: Any,
        tokenizer: Any,
        cfg: RolloutConfig,
        queue: TrajectoryQueue | None = None,
        replay: Sequence[Keyed] = (),
        image_processor: Any = None,
        ledger: PromptLedger | None = None,
    ):
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        self.prompts = prompts
        self.n_samples = n_samples
        self.sampler = sampler
        self.tool_client = tool_client
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.queue = queue
        self.ledger = PromptLedger() if ledger is None else ledger
        self.ledger.add_waiting(replay)
        self._formatter = make_formatter(tokenizer, cfg, image_processor)
        self._sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        self._exhausted = False
        self.in_flight = InFlight()

    # -------------------------------------------------------------- data position
    def in_flight_keys(self) -> list:
        """Keys of the prompts drawn but not yet ended (replay these on resume)."""
        return self.ledger.in_flight_keys()

    def consumed(self, groups: Sequence[list[Trajectory]]) -> None:
        """The consumer trained on ``groups``: their prompts are no longer in flight."""
        self.ledger.end(groups, "trained")

    def give_back(self, groups: Sequence[list[Trajectory]], reason: str) -> None:
        """``groups`` were not trained on (``reason``: "skipped" or "failed"): their
        prompts are rolled out again before any new one."""
        self.ledger.give_back(groups, reason)

    def data_state(self, source_state: Any = lambda: None) -> dict:
        """The checkpoint's data item (``PromptLedger.state``): the prompt position, the
        prompts in flight and the records of their trajectories (async mode: the groups
        rolling out and those complete in the queue; saved records not yet started)."""

        def rollouts(entries: dict[str, Entry]) -> list[dict]:
            if type(self)._group is not RolloutProducer._group:
                return []  # a subclass rolling out its own way (the gateway's agent program)
            waiting = self.queue.waiting_groups() if self.queue is not None else []
            out = snapshot(self.in_flight.groups, waiting, entries)
            done = {r["gid"] for r in out}
            unstarted = [r for g, r in self.ledger.resumed.items() if g in entries]
            return out + [r for r in unstarted if r["gid"] not in done]

        return self.ledger.state(source_state, rollouts)

    async def _next(self) -> Keyed | None:
        if self.queue is not None:
            self.ledger.give_back(self.queue.take_dropped(), "stale")
        nxt = self.ledger.start_waiting()
        if nxt is not None or self._exhausted:
            return nxt
        nxt = await asyncio.to_thread(self.ledger.draw, self.prompts)
        self._exhausted = nxt is None
        return nxt

    async def _group(self, item: PromptItem) -> list[Trajectory]:
        """Roll out ``item``'s group, registered in :attr:`in_flight` (a checkpoint keeps
        it) until :meth:`run` has put it in the queue; a group the checkpoint kept goes on
        from its record."""
        gid = item.gid()

        def builder(tid: str):
            return item_builder(item, tid, self.cfg, self.tokenizer, self._formatter)

        record = self.ledger.resumed.pop(gid, None)
        if record is not None and len(record["trajectories"]) == self.n_samples:
            slots = restore_group(record, builder)
        else:
            slots = [Slot(builder(f"{gid}-{k}")) for k in range(self.n_samples)]
        self.in_flight.add(gid, slots)

        async def one(slot: Slot) -> Trajectory:
            if not slot.done:
                await rollout_bounded(slot.builder, self.sampler, self.tool_client, self._sem)
                slot.done = True
            return slot.builder.traj

        return list(await asyncio.gather(*(one(s) for s in slots)))

    # -------------------------------------------------------------- async mode
    async def run(self) -> list[list[Trajectory]]:
        """Start a group whenever the queue admits one, until the prompts run out (then
        wait for the groups in flight) or the queue closes / the task is cancelled.
        Returns the groups it finished, in the order their prompts started."""
        if self.queue is None:
            raise ValueError(
                "RolloutProducer.run needs a queue (async mode); use "
                "next_groups for the synchronous baseline"
            )
        queue = self.queue
        tasks: list[asyncio.Task] = []

        async def one(item: PromptItem) -> list[Trajectory]:
            group = await self._group(item)
            try:
                await queue.put_group(group)
            except QueueClosed:
                return group  # not queued: still in flight (the final checkpoint keeps it)
            self.in_flight.remove(item.gid())
            return group

        try:
            while True:
                nxt = await self._next()
                if nxt is None:
                    break
                key, item = nxt  # in flight from here (resume replays it)
                await queue.admit()
                tasks.append(asyncio.create_task(one(item)))
            return list(await asyncio.gather(*tasks))
        except QueueClosed:
            return []
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -------------------------------------------------------------- sync mode
    async def next_groups(self, k: int) -> list[list[Trajectory]]:
        """The synchronous baseline: roll out exactly the next ``k`` prompts (fewer if the
        prompts run out) in lock step and return their groups."""
        items: list[PromptItem] = []
        while len(items) < k:
            nxt = await self._next()
            if nxt is None:
                break
            items.append(nxt[1])
        if not items:
            return []
        return await run_rollout_sync(
            items,
            self.n_samples,
            self.sampler,
            self.tool_client,
            self.tokenizer,
            self.cfg,
            formatter=self._formatter,
        )
