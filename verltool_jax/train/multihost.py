"""Multi-host training: every host runs the same command, JAX joins them into one cluster.

``python -m verltool_jax.train`` on each process, with ``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (or a SLURM job / TPU pod that jax detects;
``launch/multiprocess.sh`` sets them for N processes on one machine). How the work is
split:

* **prompts**: every process reads the same shuffled prompt stream and keeps the
  positions ``i`` with ``i % process_count == process_index`` (:func:`my_share`), so for
  each step the processes together take exactly the ``trainer.batch_groups`` prompts one
  process would; ``trainer.batch_groups`` is the global number and must divide by the
  process count (:func:`check_batch_groups`);
* **rollout and scoring** are process-local (each process has its own sampler, tool-server
  connection and reward pool);
* **the batch**: the scored groups of all processes are gathered to every process
  (:func:`gather_groups`, interleaved so the group order is the one-process order), each
  process builds the same global batch on the host and places only its own rows on its
  devices (``device_put`` onto the mesh's batch sharding), so sequence length, padding and
  advantages are those of a single process on the same trajectories;
* **the train step** is one SPMD computation over the global mesh; its metrics
  (``train/``, ``batch/``) are global, and so are ``rollout/``, ``reward/``, ``sync/``
  parity and ``eval/`` (computed over the gathered trajectories); ``time/``, ``queue/``,
  ``health/`` and the weight-sync figures are process 0's own;
* **the sampler** gets a process-local copy of the (possibly process-sharded) params
  (:func:`local_copy`);
* **outputs**: only process 0 writes metrics, reports, ``summary.json`` and the HF export;
  every process takes part in orbax checkpoint saves and restores (collectives); each
  process's data position is saved in the checkpoint's data item under its index
  (:func:`gather_json`);
* **evaluation**: each process rolls out its strided share of the held-out items; the
  trajectories are gathered and the metrics taken over all of them.

Every function here is a no-op (or the trivial answer) in a single-process run, which
therefore behaves exactly as before. Collectives (every ``gather_*``, :func:`all_true`,
:func:`barrier`) must be called by every process in the same order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np


def start(env=None) -> bool:
    """Join the jax.distributed cluster the environment describes (``JAX_COORDINATOR_ADDRESS``
    & co., see ``sharding.distributed_init_kwargs``), once; must run before anything
    touches a device. Returns True in a multi-process run."""
    from verltool_jax.sharding import distributed_init_kwargs, init_distributed

    if distributed_init_kwargs(env) is None:
        return False
    if not jax.distributed.is_initialized():
        init_distributed(env)
    return jax.process_count() > 1


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_multi() -> bool:
    """True when several JAX processes share this run."""
    return jax.process_count() > 1


def is_primary() -> bool:
    """True on the process that writes logs and reports (process 0)."""
    return jax.process_index() == 0


def check_batch_groups(batch_groups: int, count: int | None = None) -> int:
    """The number of groups each process rolls out per step: ``batch_groups / count``.
    ValueError naming the field and the fix when it does not divide."""
    count = process_count() if count is None else count
    if batch_groups % count:
        raise ValueError(
            f"trainer.batch_groups={batch_groups} is the global number of "
            f"prompt groups per step and must be a multiple of the number of "
            f"processes ({count}); set trainer.batch_groups to a multiple of "
            f"{count}, or change the number of processes"
        )
    return batch_groups // count


def my_share(position: int, index: int | None = None, count: int | None = None) -> bool:
    """Whether the prompt at ``position`` of the shared stream is this process's (strided)."""
    index = process_index() if index is None else index
    count = process_count() if count is None else count
    return position % count == index


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier ``name`` (nothing with one process)."""
    if is_multi():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _allgather_np(x: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=False))


def gather_ints(values: Sequence[int]) -> np.ndarray:
    """``[process_count, len(values)]`` int64: every process's ``values``."""
    x = np.asarray(list(values), np.int64)
    if not is_multi():
        return x[None]
    return _allgather_np(x)


def all_true(flag: bool) -> bool:
    """True iff ``flag`` is true on every process."""
    return bool(gather_ints([int(bool(flag))]).min())


def any_true(flag: bool) -> bool:
    """True iff ``flag`` is true on some process."""
    return bool(gather_ints([int(bool(flag))]).max())


def gather_json(obj: Any) -> list:
    """Every process's JSON-serialisable ``obj``, in process order (a list of one with one
    process). Sent as UTF-8 bytes padded to the longest."""
    if not is_multi():
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    n = int(gather_ints([data.size]).max())
    buf = np.zeros(n, np.uint8)
    buf[: data.size] = data
    out = []
    for row in _allgather_np(buf):
        raw = bytes(row).rstrip(b"\0")
        out.append(json.loads(raw.decode()))
    return out


def gather_groups(groups: Sequence[list]) -> list[list]:
    """All processes' scored groups, on every process, interleaved by position (group j of
    process 0, group j of process 1, ..., then group j+1), which with the strided prompt
    share is the order one process would have taken them in. With one process, ``groups``
    itself. Trajectories from other processes are rebuilt from their JSON form (every
    field but ``images`` and ``extras``); a process's own groups are kept as they are.
    Trajectories with images are refused (multi-host vision-language training is not
    supported)."""
    from verltool_jax.rollout.trajectory import Trajectory

    groups = [list(g) for g in groups]
    if not is_multi():
        return groups
    if any(getattr(t, "images", None) for g in groups for t in g):
        raise ValueError(
            "multi-host training of vision-language policies (trajectories with "
            "images) is not supported; run one process"
        )
    me = process_index()
    every = gather_json([[t.to_json() for t in g] for g in groups])
    per_proc = [
        groups if p == me else [[Trajectory.from_json(d) for d in g] for g in gs]
        for p, gs in enumerate(every)
    ]
    out = []
    for j in range(max(len(g) for g in per_proc)):
        for gs in per_proc:
            if j < len(gs):
                out.append(gs[j])
    return out


def local_copy(tree: Any) -> Any:
    """``tree`` with every array as a full copy on this process's first local device (the
    params a process-local sampler serves); ``tree`` itself with one process. Every process
    must call it (it gathers the process-sharded arrays)."""
    if not is_multi():
        return tree
    from jax.experimental import multihost_utils

    host = multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_put(host, jax.local_devices()[0])


def to_host(tree: Any) -> Any:
    """``tree`` as numpy arrays of the full (global) values; every process must call it."""
    if not is_multi():
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def globalize(tree: Any, mesh) -> Any:
    """``tree`` with every array not already on ``mesh`` replicated over it (the step
    counter, rng and optimizer counters start on one local device); unchanged with one
    process or no mesh."""
    if not is_multi() or mesh is None:
        return tree
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rep = NamedSharding(mesh, P())

    def one(x):
        s = getattr(x, "sharding", None)
        if isinstance(s, NamedSharding) and s.mesh == mesh:
            return x
        return jax.device_put(np.asarray(x), rep)

    return jax.tree.map(one, tree)


def check_supported(rc, mesh) -> None:
    """ValueError for what multi-host training does not support: a ``trainer.batch_groups``
    the process count does not divide, a trainer mesh that leaves out a process's devices,
    the observation-mask ablation."""
    if not is_multi():
        return
    check_batch_groups(rc.trainer.batch_groups)
    procs = set() if mesh is None else {d.process_index for d in mesh.devices.flat}
    if procs != set(range(process_count())):
        raise ValueError(
            f"with {process_count()} processes the trainer mesh must hold "
            f"devices of every process, but mesh_shape={tuple(rc.mesh_shape)} "
            f"(placement.trainer_devices={tuple(rc.placement.trainer_devices)}) "
            f"gives a mesh on processes {sorted(procs)}; use mesh_shape with "
            f"-1 (e.g. (1, -1, 1)) and no trainer_devices"
        )
    if not rc.rollout.mask_observations:
        raise ValueError(
            "rollout.mask_observations=False (the observation-mask ablation) is "
            "not supported with several processes; run it on one process"
        )


def data_state(mine: dict) -> dict:
    """The checkpoint's data item: ``mine`` with one process; with several, every process's
    ``mine`` under ``processes`` (process order) plus ``process_count`` (a collective)."""
    if not is_multi():
        return mine
    return {"processes": gather_json(mine), "process_count": process_count()}


def my_data_state(saved: dict) -> dict:
    """This process's part of a restored data item (``data_state``'s inverse). ValueError
    when the checkpoint was written by a different number of processes."""
    n, me = process_count(), process_index()
    if "processes" not in saved:
        if n > 1 and (saved.get("prompts") is not None or saved.get("replay")):
            raise ValueError(
                f"the checkpoint was written by one process; resuming it with "
                f"{n} processes would change every process's prompt share; "
                f"resume with one process (or start a new trainer.out_dir)"
            )
        return saved
    parts = saved["processes"]
    if len(parts) != n:
        raise ValueError(
            f"the checkpoint was written by {len(parts)} processes, this run has "
            f"{n}; resume with {len(parts)} processes (JAX_NUM_PROCESSES) or "
            f"start a new trainer.out_dir"
        )
    return dict(parts[me])
