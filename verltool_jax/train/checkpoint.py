"""Orbax checkpoints of the ``TrainState`` plus the data iterator's position.

A checkpoint at step s (= ``int(state.step)``) holds two items:

* ``state``: ``params``, ``opt_state``, ``step``, ``rng``, ``ref_params`` (if any) and the
  critic's ``value_params`` and ``value_opt_state`` (if any),
  saved asynchronously (the write to disk overlaps the next train steps);
* ``data``: a JSON dict, the data iterator's state (e.g. grain's ``get_state()``), so a
  resumed run reads the same prompts the uninterrupted run would have.

``graphdef`` is not saved: the model structure comes from the model config. Restoring
needs a template ``TrainState`` (built the same way as at the start of a run); arrays are
restored with the template's shapes, dtypes and shardings.

Crash consistency (a kill at any moment of a save never leaves a state that resume loads):

* orbax writes a step into ``<step>.orbax-checkpoint-tmp`` and renames it to ``<step>``
  when done; a directory with the temporary name is never listed as a checkpoint;
* before that rename (orbax's ``post_finalization_callback``), :func:`seal` flushes every
  file to disk (``fsync``) and writes the completeness marker ``verltool_complete.json``
  (the size and sha256 of every file; written to a temporary file, flushed and renamed),
  so a published step holds its marker, and a marker is durable only after the data;
* at start (:class:`Checkpointer`), the newest steps are checked against their markers
  (:func:`check_step`); a step whose marker is missing (once the directory holds any
  marked step), or a file missing, truncated or changed, is moved to
  ``<directory>/rejected/`` and named in :attr:`Checkpointer.rejected`, and the run resumes
  from the newest complete step. A directory written before the markers existed (no step
  marked) is trusted as orbax wrote it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from verltool_jax.train.state import TrainState

log = logging.getLogger("verltool_jax.train")

STATE_FIELDS = (
    "params", "opt_state", "step", "rng", "ref_params", "value_params", "value_opt_state",
)  # fmt: skip
MARKER = "verltool_complete.json"
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's name of a step being written
REJECTED_DIR = "rejected"
# orbax rewrites these after the marker (the commit time, the success note): not checked
UNCHECKED = frozenset({MARKER, "_CHECKPOINT_METADATA", "commit_success.txt"})
_CHUNK = 1 << 22


def _files(step_dir: Path) -> list[Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name not in UNCHECKED)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest(path: Path, flush: bool = False) -> tuple[int, str]:
    """(size, sha256 hex) of ``path``; ``flush``: fsync it first."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        if flush:
            os.fsync(f.fileno())
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def seal(step_dir: str | os.PathLike, step: int) -> None:
    """Flush every file of the finished step directory ``step_dir`` to disk and write its
    completeness marker (each file's size and sha256), itself flushed and renamed into
    place, then flush the directories."""
    step_dir = Path(step_dir)
    files = {}
    for p in _files(step_dir):
        size, sha = _digest(p, flush=True)
        files[str(p.relative_to(step_dir))] = {"size": size, "sha256": sha}
    for d in sorted({p.parent for p in step_dir.rglob("*")} | {step_dir}, reverse=True):
        _fsync_dir(d)
    tmp = step_dir / (MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / MARKER)
    _fsync_dir(step_dir)


def check_step(step_dir: str | os.PathLike, require_marker: bool) -> str | None:
    """Why the step directory ``step_dir`` must not be restored, or None if it is whole:
    its marker is missing (when ``require_marker``) or unreadable, or a file it lists is
    missing, has another size (truncated) or another sha256 (changed)."""
    step_dir = Path(step_dir)
    marker = step_dir / MARKER
    if not marker.exists():
        return (
            f"it has no completeness marker ({MARKER}): its save was cut short"
            if require_marker
            else None
        )
    try:
        files = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its completeness marker {marker} is unreadable ({e})"
    for rel, want in sorted(files.items()):
        p = step_dir / rel
        if not p.is_file():
            return f"file {p} is missing"
        size = p.stat().st_size
        if size != want["size"]:
            return f"file {p} is truncated or extended ({size} bytes, {want['size']} written)"
        if _digest(p)[1] != want["sha256"]:
            return f"file {p} is corrupted (its sha256 differs from the one written)"
    return None


@dataclass(frozen=True)
class Rejected:
    """A checkpoint step not restored: why, and where it was moved."""

    step: int
    reason: str
    moved_to: str

    def describe(self) -> str:
        return f"checkpoint step {self.step} is unusable: {self.reason}; moved to {self.moved_to}"


def _step_dirs(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    return sorted(
        ((int(p.name), p) for p in directory.iterdir() if p.name.isdigit() and p.is_dir()),
        reverse=True,
    )


def _move_aside(directory: Path, step_dir: Path) -> Path:
    dest_root = directory / REJECTED_DIR
    dest_root.mkdir(exist_ok=True)
    dest = dest_root / f"{step_dir.name}.{time.strftime('%Y%m%dT%H%M%S')}"
    n = 0
    while dest.exists():
        n += 1
        dest = dest_root / f"{step_dir.name}.{time.strftime('%Y%m%dT%H%M%S')}.{n}"
    os.replace(step_dir, dest)
    _fsync_dir(directory)
    return dest


def latest_complete_step(directory: str | os.PathLike) -> int | None:
    """The newest step of ``directory`` that :func:`check_step` finds whole (nothing is
    moved), or None."""
    steps = _step_dirs(Path(directory))
    require = any((p / MARKER).exists() for _, p in steps)
    return next((step for step, path in steps if check_step(path, require) is None), None)


def reject_incomplete(directory: str | os.PathLike) -> list[Rejected]:
    """Move the newest steps of ``directory`` that :func:`check_step` finds incomplete or
    corrupted to ``directory/rejected/``, newest first, until a whole one (or none) is
    left; what was moved. A marker is required once any step of the directory has one."""
    directory = Path(directory)
    steps = _step_dirs(directory)
    require = any((p / MARKER).exists() for _, p in steps)
    out = []
    for step, path in steps:
        reason = check_step(path, require)
        if reason is None:
            break
        out.append(Rejected(step, reason, str(_move_aside(directory, path))))
    return out


def _state_tree(state: TrainState) -> dict:
    return {k: getattr(state, k) for k in STATE_FIELDS if getattr(state, k) is not None}


class Checkpointer:
    """Save every ``save_every`` steps, keep the last ``keep``, resume from the latest
    complete one.

    ``Checkpointer(directory, save_every=k, keep=n)``; ``maybe_save(state, data_state)``
    after each train step; ``restore(template, step=None) -> (state, data_state)``;
    ``wait()`` blocks until pending asynchronous saves are on disk; ``close()``.
    :attr:`rejected` lists the newest steps found incomplete or corrupted at start (see
    the module), newest first; the caller says so.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        save_every: int = 1,
        keep: int = 2,
        async_save: bool = True,
    ):
        from verltool_jax.train import multihost

        if save_every < 1:
            raise ValueError(f"trainer.ckpt_every must be >= 1, got {save_every}")
        if keep < 1:
            raise ValueError(f"trainer.keep_ckpts must be >= 1, got {keep}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.save_every = save_every
        self.async_save = async_save
        self._saving: int | None = None
        self._primary = multihost.is_primary()
        # Before orbax lists the steps: process 0 moves the unusable newest ones aside.
        self.rejected: list[Rejected] = reject_incomplete(self.directory) if self._primary else []
        if multihost.is_multi():
            multihost.barrier("checkpoint:checked")
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=1,
            # always asynchronous, for the callback that seals a step before orbax
            # publishes it; async_save=False waits for each save instead
            enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._seal_saving),
            create=True,
        )
        self._mngr = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data")
        )

    def _seal_saving(self) -> None:
        """orbax's post-finalization callback: the step being saved is written, not yet
        renamed from its temporary name; seal it (process 0)."""
        step = self._saving
        if step is None or not self._primary:
            return
        tmp = Path(self.directory) / f"{step}{TMP_SUFFIX}"
        seal(tmp if tmp.is_dir() else Path(self.directory) / str(step), step)

    def maybe_save(
        self, state: TrainState, data_state: dict | None = None, force: bool = False
    ) -> bool:
        """Save ``state`` (+ ``data_state``) if its step is due (or ``force``); True if saved."""
        step = int(jax.device_get(state.step))
        if not force and step % self.save_every:
            return False
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(_state_tree(state)),
            data=ocp.args.JsonSave(dict(data_state or {})),
        )
        self._mngr.wait_until_finished()  # the callback seals one step at a time
        self._saving = step
        saved = bool(self._mngr.save(step, args=args, force=force))
        if not self.async_save:
            self.wait()
        return saved

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mngr.all_steps())

    def restore(self, template: TrainState, step: int | None = None) -> tuple[TrainState, dict]:
        """Restore step ``step`` (default: latest) into the structure of ``template``."""
        self.wait()
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _state_tree(template))
        out = self._mngr.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()
            ),
        )
        tree = out["state"]
        missing = set(_state_tree(template)) - set(tree)
        if missing:
            raise ValueError(
                f"checkpoint step {step} lacks {sorted(missing)}; was it saved "
                f"from a TrainState with the same fields (with_reference; a critic, "
                f"algo.adv_estimator='gae')?"
            )
        return template.replace(**tree), dict(out["data"] or {})

    def wait(self) -> None:
        self._mngr.wait_until_finished()

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
