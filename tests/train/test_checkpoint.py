"""Orbax checkpoints: a resumed run reproduces the uninterrupted one; keep-last-n; errors."""

import json

import jax
import numpy as np
import pytest
from support.train import batch, host, new_state, step_for

from verltool_jax.train.checkpoint import Checkpointer

N_STEPS = 4


def _run(state, step, start, stop, ckpt=None):
    """Steps ``start..stop-1`` on batch(seed=i); saves after each step when ``ckpt``."""
    losses = []
    for i in range(start, stop):
        state, m = step(state, batch(10 + i))
        losses.append(float(m["loss"]))
        if ckpt is not None:
            ckpt.maybe_save(state, {"next_batch": i + 1})
    return state, losses


def test_resumed_run_gives_the_same_losses(tmp_path):
    step, _ = step_for("ppo_full")  # AdamW + schedule, reference params, 2 epochs
    full_state, full_losses = _run(new_state("ppo_full"), step, 0, N_STEPS)

    with Checkpointer(tmp_path / "ck", save_every=2, keep=2) as ck:
        _, first = _run(new_state("ppo_full"), step, 0, 2, ckpt=ck)  # saves at step 2
    assert first == full_losses[:2]

    # a fresh process: a differently initialised template, then restore
    with Checkpointer(tmp_path / "ck", save_every=2, keep=2) as ck:
        assert ck.latest_step() == 2
        state, data = ck.restore(new_state("ppo_full", seed=5))
    assert data == {"next_batch": 2}
    assert int(state.step) == 2
    assert state.ref_params is not None
    state, rest = _run(state, step, data["next_batch"], N_STEPS)
    np.testing.assert_allclose(first + rest, full_losses, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(state.rng), np.asarray(full_state.rng))
    for a, b in zip(jax.tree.leaves(host(state.params)), jax.tree.leaves(host(full_state.params))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(state.step) == int(full_state.step) == N_STEPS


def test_keep_last_n_interval_and_data_json(tmp_path):
    state = new_state("gspo_whole")
    with Checkpointer(tmp_path, save_every=2, keep=2) as ck:
        saved = [ck.maybe_save(state.replace(step=np.int32(s)), {"pos": s}) for s in range(1, 8)]
        assert saved == [False, True, False, True, False, True, False]
        ck.wait()
        assert ck.all_steps() == [4, 6]
        assert ck.maybe_save(state.replace(step=np.int32(7)), {"pos": 7}, force=True)
        ck.wait()
        assert ck.all_steps() == [6, 7]
        restored, data = ck.restore(state, step=6)
    assert data == {"pos": 6} and int(restored.step) == 6
    # the data state is a plain JSON file next to the arrays
    with open(tmp_path / "7" / "data" / "metadata") as f:
        assert json.load(f) == {"pos": 7}


def test_restore_errors(tmp_path):
    state = new_state("gspo_whole")
    with Checkpointer(tmp_path / "empty") as ck:
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            ck.restore(state)
    with pytest.raises(ValueError, match="ckpt_every"):
        Checkpointer(tmp_path / "x", save_every=0)
