"""The trainer's side of the data accounting (:mod:`verltool_jax.rollout.ledger`): what
became of each group a step took, and the check at the end of the run.

After a step, each of this process's groups (:func:`settle`):

* the batch was skipped (too many failed trajectories): given back, rolled out again;
* the group is in the update: *trained* (its failed trajectories, left out, are not
  rolled out again);
* every trajectory of the group failed: given back;
* otherwise the no-signal filter (``algo.dynamic_sampling``) dropped it: *no_signal*.

A batch that made no update also frees its admission slots in the queue. At the end
(:func:`check_accounting`) every process's ledger is checked and the sum goes to ``summary.json``
and the console; a mismatch is logged as an error naming the serials.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from verltool_jax.rollout.ledger import Accounting
from verltool_jax.rollout.producer import RolloutProducer
from verltool_jax.rollout.queue import TrajectoryQueue
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.train import multihost
from verltool_jax.train.health import trajectory_failed

log = logging.getLogger(__name__)


async def settle(
    producer: RolloutProducer,
    queue: TrajectoryQueue | None,
    groups: Sequence[list[Trajectory]],
    batch: Any = None,
    skipped: bool = False,
) -> None:
    """Account for this process's ``groups`` after a step: ``batch`` is the
    ``RLBatch`` trained on (None: no update), ``skipped`` a batch the health check
    refused (see the module doc)."""
    trained = {t.group_id for t in batch.trajectories} if batch is not None else set()
    if skipped:
        producer.give_back(list(groups), "skipped")
    else:
        producer.consumed([g for g in groups if g and g[0].group_id in trained])
        rest = [g for g in groups if g and g[0].group_id not in trained]
        producer.give_back([g for g in rest if all(map(trajectory_failed, g))], "failed")
        no_signal = [g for g in rest if not all(map(trajectory_failed, g))]
        producer.ledger.end(no_signal, "no_signal")
    if batch is None and queue is not None:
        await queue.release(len(groups))


def check_accounting(producer: RolloutProducer | None) -> dict | None:
    """The run's data accounting over every process (a collective), logged; a mismatch
    is an error line. None when the run took no RL step (no producer)."""
    if producer is None:
        return None
    report = Accounting.merge(multihost.gather_json(producer.ledger.report().to_json()))
    if report.ok:
        log.info(f"[trainer] {report.describe()}")
    else:
        log.error(f"[trainer] {report.describe()}")
    return report.to_json()
