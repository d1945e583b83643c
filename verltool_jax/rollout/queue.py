"""The host-side queue of finished trajectory groups between rollout and the trainer.

* Groups (every sample of one prompt) are released only when complete: producers call
  :meth:`TrajectoryQueue.put` per trajectory (the queue assembles groups of
  ``group_size``) or :meth:`TrajectoryQueue.put_group` with a whole group.
* The trainer calls :meth:`TrajectoryQueue.get_batch` for ``n`` groups and
  :meth:`TrajectoryQueue.set_version` after each weight update.
* Staleness of a group = trainer version - oldest policy version that sampled any of
  its tokens. Groups with staleness > ``max_staleness`` are dropped (counted) and kept
  for :meth:`TrajectoryQueue.take_dropped` (the producer rolls their prompts out again).
* Bounded: at most ``max_groups`` complete groups wait; ``put`` blocks (backpressure).
* Admission (:meth:`admit`): with ``groups_per_batch`` set, a producer may start group
  number ``s`` only while ``s - dropped < (version + max_staleness + 1) * groups_per_batch``,
  so rollout for the next step overlaps with training of the current one exactly when
  ``max_staleness >= 1``, and with ``max_staleness = 0`` rollout is on-policy. A batch
  taken but not trained on (no update) hands its groups' slots back
  (:meth:`release`, counted in ``dropped`` above), else rollout would stall.
  ``start_version`` (a resumed run) is the version the count starts from: ``version``
  above is then the number of updates since the queue was made.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from verltool_jax import metric_names as names
from verltool_jax.rollout.trajectory import Trajectory


class QueueClosed(RuntimeError):
    """The queue was closed; no more groups will come or be accepted."""


def group_min_version(group: list[Trajectory]) -> int:
    """Oldest policy version that sampled a token of the group (-1 if none sampled)."""
    vs = [t.min_version for t in group if t.min_version >= 0]
    return min(vs) if vs else -1


def staleness(current_version: int, group: list[Trajectory]) -> int:
    """``current_version - group_min_version(group)``; 0 for a group with no sampled token."""
    v = group_min_version(group)
    return 0 if v < 0 else current_version - v


@dataclass
class QueueMetrics:
    groups_in: int = 0
    groups_out: int = 0
    dropped_stale: int = 0
    released: int = 0  # groups taken without an update (their admission slots freed)
    trajectories_in: int = 0
    put_wait_s: float = 0.0  # producers blocked by backpressure (total)
    get_wait_s: float = 0.0  # trainer waiting for groups (total)
    admit_wait_s: float = 0.0  # producers waiting for admission (total)
    max_depth: int = 0
    staleness_out: list[int] = field(default_factory=list)  # of every group handed out

    def summary(self, depth: int) -> dict:
        s = self.staleness_out
        return {
            names.QUEUE_GROUPS_IN: self.groups_in,
            names.QUEUE_GROUPS_OUT: self.groups_out,
            names.QUEUE_DROPPED_STALE: self.dropped_stale,
            names.QUEUE_RELEASED: self.released,
            names.QUEUE_DEPTH: depth,
            names.QUEUE_MAX_DEPTH: self.max_depth,
            names.QUEUE_PUT_WAIT: self.put_wait_s,
            names.QUEUE_GET_WAIT: self.get_wait_s,
            names.QUEUE_ADMIT_WAIT: self.admit_wait_s,
            names.QUEUE_STALENESS_MEAN: (sum(s) / len(s)) if s else 0.0,
            names.QUEUE_STALENESS_MAX: max(s) if s else 0,
        }


class TrajectoryQueue:
    """Bounded asyncio queue of complete trajectory groups with staleness control."""

    def __init__(
        self,
        max_groups: int = 64,
        max_staleness: int = 1,
        group_size: int | None = None,
        groups_per_batch: int | None = None,
        start_version: int = 0,
    ) -> None:
        if max_groups < 1:
            raise ValueError(f"TrajectoryQueue.max_groups must be >= 1, got {max_groups}")
        if max_staleness < 0:
            raise ValueError(f"TrajectoryQueue.max_staleness must be >= 0, got {max_staleness}")
        if group_size is not None and group_size < 1:
            raise ValueError(f"TrajectoryQueue.group_size must be >= 1, got {group_size}")
        if groups_per_batch is not None and groups_per_batch < 1:
            raise ValueError(
                f"TrajectoryQueue.groups_per_batch must be >= 1, got {groups_per_batch}"
            )
        self.max_groups = max_groups
        self.max_staleness = max_staleness
        self.group_size = group_size
        self.groups_per_batch = groups_per_batch
        if start_version < 0:
            raise ValueError(f"TrajectoryQueue.start_version must be >= 0, got {start_version}")
        self.start_version = start_version
        self.version = start_version
        self.metrics = QueueMetrics()
        self._ready: deque[list[Trajectory]] = deque()
        self._pending: dict[str, list[Trajectory]] = {}
        self._dropped: list[list[Trajectory]] = []  # stale groups not yet taken back
        self._started = 0
        self._closed = False
        self._error: BaseException | None = None  # the producer's, raised to the getter
        self._cond = asyncio.Condition()

    # --- introspection ----------------------------------------------------------------
    def depth(self) -> int:
        return len(self._ready)

    def summary(self) -> dict:
        return self.metrics.summary(self.depth())

    def waiting_groups(self) -> list[list[Trajectory]]:
        """The complete groups waiting for the trainer (a checkpoint keeps them)."""
        return list(self._ready)

    # --- producers --------------------------------------------------------------------
    def _admissible(self) -> bool:
        if self.groups_per_batch is None:
            return True
        allowed = (
            self.version - self.start_version + self.max_staleness + 1
        ) * self.groups_per_batch
        return self._started - self.metrics.dropped_stale - self.metrics.released < allowed

    async def admit(self) -> None:
        """Wait until one more group may be started (see the module docstring)."""
        t0 = time.perf_counter()
        async with self._cond:
            await self._cond.wait_for(lambda: self._closed or self._admissible())
            if self._closed:
                raise QueueClosed("TrajectoryQueue is closed")
            self._started += 1
        self.metrics.admit_wait_s += time.perf_counter() - t0

    async def put(self, traj: Trajectory) -> None:
        """Add one trajectory; its group is released when ``group_size`` have arrived."""
        if self.group_size is None:
            raise ValueError(
                "TrajectoryQueue.put(traj) needs group_size; set it, or use put_group(group)"
            )
        bucket = self._pending.setdefault(traj.group_id, [])
        if any(t.trajectory_id == traj.trajectory_id for t in bucket):
            raise ValueError(f"trajectory {traj.trajectory_id} was put twice")
        bucket.append(traj)
        if len(bucket) == self.group_size:
            del self._pending[traj.group_id]
            await self.put_group(bucket)

    async def put_group(self, group: list[Trajectory]) -> None:
        """Add a complete group; blocks while ``max_groups`` groups are waiting."""
        if not group:
            raise ValueError("put_group: the group is empty")
        gids = {t.group_id for t in group}
        if len(gids) != 1:
            raise ValueError(
                f"put_group: trajectories of one group must share group_id, got {sorted(gids)}"
            )
        t0 = time.perf_counter()
        async with self._cond:
            await self._cond.wait_for(lambda: self._closed or len(self._ready) < self.max_groups)
            if self._closed:
                raise QueueClosed("TrajectoryQueue is closed")
            self._ready.append(list(group))
            self.metrics.groups_in += 1
            self.metrics.trajectories_in += len(group)
            self.metrics.max_depth = max(self.metrics.max_depth, len(self._ready))
            self._cond.notify_all()
        self.metrics.put_wait_s += time.perf_counter() - t0

    # --- the trainer ------------------------------------------------------------------
    def _drop_stale_locked(self) -> None:
        keep: deque[list[Trajectory]] = deque()
        for g in self._ready:
            if staleness(self.version, g) > self.max_staleness:
                self.metrics.dropped_stale += 1
                self._dropped.append(g)
            else:
                keep.append(g)
        self._ready = keep

    def take_dropped(self) -> list[list[Trajectory]]:
        """The groups dropped as too stale since the last call (to roll out again)."""
        out, self._dropped = self._dropped, []
        return out

    async def release(self, n: int) -> None:
        """``n`` groups were taken but made no update (a skipped batch, or one the
        no-signal filter emptied): they no longer count against admission."""
        async with self._cond:
            self.metrics.released += n
            self._cond.notify_all()

    async def set_version(self, version: int) -> None:
        """The trainer's policy version after a weight update; drops now-stale groups."""
        if version < self.version:
            raise ValueError(f"set_version: version went back from {self.version} to {version}")
        async with self._cond:
            self.version = version
            self._drop_stale_locked()
            self._cond.notify_all()

    async def get_batch(
        self, num_groups: int, timeout: float | None = None
    ) -> list[list[Trajectory]]:
        """Take ``num_groups`` fresh groups (oldest first), waiting for them to arrive.

        Raises ``TimeoutError`` after ``timeout`` seconds and :class:`QueueClosed` if the
        queue closes before enough groups came.
        """
        if num_groups < 1:
            raise ValueError(f"get_batch: num_groups must be >= 1, got {num_groups}")
        out: list[list[Trajectory]] = []
        t0 = time.perf_counter()
        async with asyncio.timeout(timeout):
            async with self._cond:
                try:
                    while len(out) < num_groups:
                        self._drop_stale_locked()
                        while self._ready and len(out) < num_groups:
                            out.append(self._ready.popleft())
                        self._cond.notify_all()
                        if len(out) < num_groups:
                            if self._error is not None:
                                raise self._error
                            if self._closed:
                                raise QueueClosed(
                                    f"TrajectoryQueue closed with {len(out)} of "
                                    f"{num_groups} groups available"
                                )
                            await self._cond.wait()
                except BaseException:
                    # Timeout, cancellation or close: nothing taken is lost.
                    self._ready.extendleft(reversed(out))
                    raise
        self.metrics.staleness_out.extend(staleness(self.version, g) for g in out)
        self.metrics.groups_out += len(out)
        self.metrics.get_wait_s += time.perf_counter() - t0
        return out

    def watch(self, producer: asyncio.Task) -> asyncio.Task:
        """Close the queue when ``producer`` (the task that fills it) fails, so that a
        waiting :meth:`get_batch` raises the producer's exception instead of waiting
        forever; returns ``producer``."""

        def done(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                self._error = task.exception()
                asyncio.ensure_future(self.close())

        producer.add_done_callback(done)
        return producer

    async def close(self) -> None:
        """Wake everyone; later puts and short gets raise :class:`QueueClosed`."""
        async with self._cond:
            self._closed = True
            self._cond.notify_all()
