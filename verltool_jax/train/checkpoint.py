"""Orbax checkpoints of the ``TrainState`` plus the data iterator's position.

A checkpoint at step s (= ``int(state.step)``) holds two items:

* ``state``: ``params``, ``opt_state``, ``step``, ``rng`` and ``ref_params`` (if any),
  saved asynchronously (the write to disk overlaps the next train steps);
* ``data``: a JSON dict, the data iterator's state (e.g. grain's ``get_state()``), so a
  resumed run reads the same prompts the uninterrupted run would have.

``graphdef`` is not saved: the model structure comes from the model config. Restoring
needs a template ``TrainState`` (built the same way as at the start of a run); arrays are
restored with the template's shapes, dtypes and shardings.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

from verltool_jax.train.state import TrainState

STATE_FIELDS = ("params", "opt_state", "step", "rng", "ref_params")


def _state_tree(state: TrainState) -> dict:
    return {k: getattr(state, k) for k in STATE_FIELDS if getattr(state, k) is not None}


class Checkpointer:
    """Save every ``save_every`` steps, keep the last ``keep``, resume from the latest.

    ``Checkpointer(directory, save_every=k, keep=n)``; ``maybe_save(state, data_state)``
    after each train step; ``restore(template, step=None) -> (state, data_state)``;
    ``wait()`` blocks until pending asynchronous saves are on disk; ``close()``.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        save_every: int = 1,
        keep: int = 2,
        async_save: bool = True,
    ):
        if save_every < 1:
            raise ValueError(f"trainer.ckpt_every must be >= 1, got {save_every}")
        if keep < 1:
            raise ValueError(f"trainer.keep_ckpts must be >= 1, got {keep}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=1,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._mngr = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data")
        )

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
        return bool(self._mngr.save(step, args=args, force=force))

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
                f"from a TrainState with the same fields (with_reference)?"
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
