"""A full disk: a run refuses to start without room for one checkpoint, and a run whose
disk fills (writing a checkpoint, metrics, trajectories, reports) stops with a clear
message and its own exit code (4, ``python -m verltool_jax.train``), its last complete
checkpoint intact (a save cut short is never published: ``train/checkpoint.py``).

* :func:`checkpoint_bytes`: what one checkpoint of a ``TrainState`` takes: the bytes of
  its arrays (params, optimizer state, step, rng, reference params), the arrays orbax
  writes uncompressed;
* :func:`require_free_space`: :class:`DiskFull` naming the estimate and the free space
  when the filesystem of a directory has less than the estimate plus a margin;
* :func:`is_disk_full` / :func:`disk_full_message`: a failure caused, anywhere in its
  chain, by ``ENOSPC`` / ``EDQUOT`` (or a library's "No space left on device" text, as
  orbax's background save and tensorstore report it).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax

MIB = 1 << 20
MARGIN_BYTES = 4 * MIB  # metadata, the marker, metrics written meanwhile
MARGIN_FRAC = 0.05
_NO_SPACE = ("no space left on device", "disk quota exceeded")


class DiskFull(RuntimeError):
    """The disk of the run's output directory is (or would be) full."""


def tree_nbytes(tree: Any) -> int:
    """Bytes of the arrays (or shape/dtype structs) in ``tree``."""
    return int(
        sum(
            int(getattr(x, "size", 0)) * int(getattr(getattr(x, "dtype", None), "itemsize", 0))
            for x in jax.tree.leaves(tree)
        )
    )


def checkpoint_bytes(make_state: Callable[[], Any]) -> int:
    """The bytes one checkpoint of the state that ``make_state()`` builds takes, traced
    with ``jax.eval_shape`` (nothing is allocated)."""
    from verltool_jax.train.checkpoint import _state_tree

    return tree_nbytes(_state_tree(jax.eval_shape(make_state)))


def needed_bytes(estimate: int) -> int:
    """Free space asked for one checkpoint of ``estimate`` bytes: plus 5% and 4 MiB."""
    return int(estimate * (1 + MARGIN_FRAC)) + MARGIN_BYTES


def require_free_space(directory: str | os.PathLike, estimate: int) -> None:
    """Raise :class:`DiskFull` if the filesystem of ``directory`` (its nearest existing
    parent) has less free space than :func:`needed_bytes` of ``estimate``."""
    path = Path(directory).resolve()
    while not path.exists():
        path = path.parent
    free = shutil.disk_usage(path).free
    need = needed_bytes(estimate)
    if free < need:
        raise DiskFull(
            f"not enough free space for one checkpoint in {directory}: a checkpoint of this "
            f"model takes about {estimate / MIB:.1f} MiB (params, optimizer state, reference), "
            f"{need / MIB:.1f} MiB is asked for with the margin, {free / MIB:.1f} MiB is free; "
            "free some space or set trainer.out_dir on a larger disk"
        )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes / contexts, each once."""
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its cause/context chain) is a full disk."""
    for e in _chain(exc):
        if isinstance(e, DiskFull):
            return True
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(t in str(e).lower() for t in _NO_SPACE):
            return True
    return False


def disk_full_message(exc: BaseException, out_dir: str | os.PathLike) -> str:
    """What the console says when a run stops on a full disk: the cause, the free space
    now, the last complete checkpoint and how to go on."""
    from verltool_jax.train.checkpoint import latest_complete_step

    first = next((e for e in _chain(exc) if isinstance(e, DiskFull)), None)
    if first is not None:
        return f"[trainer] refused to start: {first}"
    cause = next(
        (
            e
            for e in _chain(exc)
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        ),
        exc,
    )
    out = Path(out_dir)
    probe = out if out.exists() else out.parent
    try:
        free = f"{shutil.disk_usage(probe).free / MIB:.1f} MiB free now"
    except OSError:
        free = "free space unknown"
    step = latest_complete_step(out / "checkpoints")
    kept = (
        f"the last complete checkpoint, step {step} in {out / 'checkpoints'}, is intact"
        if step is not None
        else "no checkpoint was complete yet"
    )
    return (
        f"[trainer] stopped: the disk holding {out} is full ({type(cause).__name__}: "
        f"{cause}; {free}); {kept}. Free some space (or move trainer.out_dir) and run the "
        "same command again to resume"
    )
