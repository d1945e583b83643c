"""TrajectoryQueue: group release, batches, staleness dropping, backpressure, admission."""

import asyncio

import pytest

from verltool_jax.rollout.queue import QueueClosed, TrajectoryQueue, staleness
from verltool_jax.rollout.trajectory import Trajectory


def traj(gid, k, version=0, n=3):
    return Trajectory(
        trajectory_id=f"{gid}-{k}",
        group_id=gid,
        prompt_ids=[1],
        response_ids=[5] * n,
        loss_mask=[1] * n,
        logprobs=[0.0] * n,
        versions=[version] * n,
    )


async def test_groups_released_only_when_complete():
    q = TrajectoryQueue(max_groups=4, group_size=3)
    await q.put(traj("a", 0))
    await q.put(traj("b", 0))
    await q.put(traj("a", 1))
    assert q.depth() == 0
    await q.put(traj("a", 2))
    assert q.depth() == 1
    (g,) = await q.get_batch(1, timeout=1)
    assert sorted(t.trajectory_id for t in g) == ["a-0", "a-1", "a-2"]
    with pytest.raises(ValueError, match="put twice"):
        await q.put(traj("b", 0))


async def test_staleness_dropping_is_counted():
    q = TrajectoryQueue(max_groups=8, max_staleness=1)
    for gid, v in [("old", 0), ("mid", 1), ("new", 2)]:
        await q.put_group([traj(gid, 0, v), traj(gid, 1, v)])
    await q.set_version(2)  # "old" is 2 versions behind: dropped
    assert q.metrics.dropped_stale == 1
    batch = await q.get_batch(2, timeout=1)
    assert [g[0].group_id for g in batch] == ["mid", "new"]
    assert q.metrics.staleness_out == [1, 0]
    # a group mixing versions counts its oldest token
    g = [traj("m", 0, 3), traj("m", 1, 1)]
    assert staleness(3, g) == 2
    s = q.summary()
    assert s["queue/dropped_stale"] == 1 and s["queue/groups_out"] == 2


async def test_backpressure_blocks_producers_until_trainer_takes():
    q = TrajectoryQueue(max_groups=2)
    await q.put_group([traj("a", 0)])
    await q.put_group([traj("b", 0)])
    blocked = asyncio.create_task(q.put_group([traj("c", 0)]))
    await asyncio.sleep(0.05)
    assert not blocked.done() and q.depth() == 2
    await q.get_batch(1, timeout=1)
    await asyncio.wait_for(blocked, 1)
    assert q.depth() == 2 and q.metrics.put_wait_s >= 0.04


async def test_get_batch_timeout_loses_nothing():
    q = TrajectoryQueue()
    await q.put_group([traj("a", 0)])
    with pytest.raises(TimeoutError):
        await q.get_batch(2, timeout=0.05)
    assert q.depth() == 1  # the group taken before the timeout is back
    (g,) = await q.get_batch(1, timeout=1)
    assert g[0].group_id == "a"


async def test_close_wakes_waiters():
    q = TrajectoryQueue()
    waiter = asyncio.create_task(q.get_batch(1))
    await asyncio.sleep(0.01)
    await q.close()
    with pytest.raises(QueueClosed):
        await waiter
    with pytest.raises(QueueClosed):
        await q.put_group([traj("a", 0)])


async def test_a_failed_producer_fails_the_waiting_trainer():
    """The producer task dies (e.g. its prompt pipeline raised): the trainer waiting in
    get_batch gets the producer's exception instead of waiting forever; a cancelled
    producer (the trainer's own shutdown) is not an error."""
    q = TrajectoryQueue(max_groups=4, group_size=1)

    async def producer():
        await q.put(traj("a", 0))
        raise ValueError("every one of the 3 rows was dropped")

    q.watch(asyncio.create_task(producer()))
    (g,) = await q.get_batch(1, timeout=5)  # what it made before failing is delivered
    assert g[0].group_id == "a"
    with pytest.raises(ValueError, match="rows was dropped"):
        await q.get_batch(1, timeout=5)

    q2 = TrajectoryQueue()
    task = q2.watch(asyncio.create_task(asyncio.sleep(10)))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    with pytest.raises(TimeoutError):
        await q2.get_batch(1, timeout=0.05)


async def run_pipeline(max_staleness, steps=3, groups_per_batch=2, gen_s=0.05, train_s=0.05):
    """A producer rolling out groups with the sampler's current version and a trainer."""
    q = TrajectoryQueue(
        max_groups=16, max_staleness=max_staleness, groups_per_batch=groups_per_batch
    )
    state = {"version": 0}
    events = []
    loop = asyncio.get_running_loop()

    async def producer():
        for i in range(steps * groups_per_batch):
            await q.admit()
            v = state["version"]
            t0 = loop.time()
            await asyncio.sleep(gen_s)
            events.append(("gen", i, v, t0, loop.time()))
            await q.put_group([traj(f"g{i}", 0, v)])

    async def trainer():
        for step in range(steps):
            batch = await q.get_batch(groups_per_batch, timeout=5)
            t0 = loop.time()
            await asyncio.sleep(train_s)
            events.append(("train", step, [staleness(step, g) for g in batch], t0, loop.time()))
            state["version"] = step + 1
            await q.set_version(step + 1)

    await asyncio.gather(producer(), trainer())
    return q, events


def overlaps(events):
    trains = [e for e in events if e[0] == "train"]
    gens = [e for e in events if e[0] == "gen"]
    return any(g[3] < t[4] and t[3] < g[4] for g in gens for t in trains)


async def test_on_policy_when_max_staleness_is_zero():
    q, events = await run_pipeline(max_staleness=0)
    assert all(s == 0 for e in events if e[0] == "train" for s in e[2])
    assert not overlaps(events)  # rollout waits for each update
    assert q.metrics.dropped_stale == 0


async def test_rollout_overlaps_training_when_max_staleness_one():
    q, events = await run_pipeline(max_staleness=1)
    assert overlaps(events)
    assert max(s for e in events if e[0] == "train" for s in e[2]) <= 1
    assert q.metrics.dropped_stale == 0


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="max_staleness"):
        TrajectoryQueue(max_staleness=-1)
    with pytest.raises(ValueError, match="max_groups"):
        TrajectoryQueue(max_groups=0)


async def test_admission_counts_from_start_version():
    """A resumed run's queue admits (max_staleness + 1) batches ahead of *its* start."""
    import asyncio

    q = TrajectoryQueue(max_groups=8, max_staleness=1, groups_per_batch=2, start_version=5)
    assert q.version == 5
    for _ in range(4):  # (0 + 1 + 1) * 2 groups may start now
        await asyncio.wait_for(q.admit(), 1)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(q.admit(), 0.1)
    await q.set_version(6)  # one update later: two more
    await asyncio.wait_for(q.admit(), 1)
    with pytest.raises(ValueError, match="start_version"):
        TrajectoryQueue(start_version=-1)


async def test_stale_groups_are_kept_for_the_producer_and_release_frees_admission():
    q = TrajectoryQueue(max_groups=8, max_staleness=0, groups_per_batch=2)
    for gid in ("a", "b"):
        await asyncio.wait_for(q.admit(), 1)
        await q.put_group([traj(gid, 0, 0)])
    await q.set_version(1)  # both 1 version behind with max_staleness 0: dropped
    assert [g[0].group_id for g in q.take_dropped()] == ["a", "b"]
    assert q.take_dropped() == [] and q.metrics.dropped_stale == 2
    for gid in "cdef":  # version 1 admits (1 + 0 + 1) * 2 - (2 started - 2 dropped)
        await asyncio.wait_for(q.admit(), 1)
        await q.put_group([traj(gid, 0, 1)])
    await q.get_batch(2, timeout=1)  # a batch taken and, say, skipped: no update
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(q.admit(), 0.1)  # without release, rollout would stall
    await q.release(2)
    await asyncio.wait_for(q.admit(), 1)
    assert q.summary()["queue/released"] == 2
