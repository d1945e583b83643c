"""Sampler/trainer parity from the train step's own forward (``train.parity``): the
metrics equal the separate pass's (``train.metrics.sampler_parity``) over the same
tokens, in the plain and the shared-prompt layout, with micro-batches and with
recomputed old logprobs; tokens of an older version and padding rows are left out; the
trainer keeps the separate pass where the step cannot score the batch."""

from __future__ import annotations

import dataclasses

import numpy as np
import optax
import pytest
from flax import nnx
from support.train import MODEL_CFG, VOCAB

from configs import base
from verltool_jax import metric_names as names
from verltool_jax.models.transformer import Transformer
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.run_config import RunConfig, run_config_from_dict
from verltool_jax.train import parity
from verltool_jax.train.batch import make_batch
from verltool_jax.train.metrics import sampler_parity
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step, train_on

N = 2  # rows per group
VERSION = 3  # the version being trained


def trajectories(seed: int = 0, n_groups: int = 3) -> list[Trajectory]:
    """Groups of N with one prompt each; sampler logprobs off the model's by up to ~2
    nats; in some rows the first sampled tokens came from an older version (async
    staleness) and an observation span has loss mask 0."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(n_groups):
        prompt = rng.integers(1, VOCAB, int(rng.integers(20, 30))).tolist()
        for j in range(N):
            r = int(rng.integers(3, 9))
            mask = [1] * r
            if r >= 6:
                mask[3:5] = [0, 0]
            versions = [VERSION - 1 if (g + j) % 2 and k < 2 else VERSION for k in range(r)]
            out.append(
                Trajectory(
                    trajectory_id=f"t{g}-{j}",
                    group_id=f"g{g}",
                    prompt_ids=prompt,
                    response_ids=rng.integers(1, VOCAB, r).tolist(),
                    loss_mask=mask,
                    logprobs=[float(-rng.uniform(0.5, 6.0)) if m else 0.0 for m in mask],
                    versions=versions,
                    reward=float((g + j) % 2),
                )
            )
    return out


def run_config(shared: str, old_logprobs: str = "sampler", mini: int = 4 * N) -> RunConfig:
    c = base.get_config()
    c.rollout.n_samples = N
    c.algo.mini_batch_size = mini  # 3 groups padded to 4: one padding group
    c.algo.micro_batch_size = N  # micro-batches: the sums combine over them
    c.algo.old_logprobs = old_logprobs
    c.trainer.shared_prompt = shared
    c.model.max_seq_len = 64
    return run_config_from_dict(c)


def step_parity(rc: RunConfig, trajs: list[Trajectory]) -> tuple[dict, dict, bool]:
    """(the parity from the train step, the separate pass's, shared layout used)."""
    model = Transformer(MODEL_CFG, nnx.Rngs(0))
    algo = rc.algo_for_run()
    batch = make_batch(rc, algo, trajs, pad_id=0)
    assert batch is not None and len(batch.arrays["input_ids"]) == 4 * N  # padded
    passed = sampler_parity(
        model, trajs, VERSION, algo.temperature, 0, 64, rc.trainer.shared_prompt
    )
    assert parity.score_in_step(rc.trainer, algo, batch, VERSION)
    assert batch.arrays[parity.PARITY_MASK][len(trajs) :].sum() == 0  # padding rows
    state = TrainState.create(model, optax.sgd(0.1))
    step = make_train_step(algo, state.graphdef, optax.sgd(0.1), donate=False)
    _, metrics = train_on(step, state, batch)
    got = parity.from_step(metrics)
    assert not any(k.startswith("train/parity") for k in got)  # replaced, not logged
    return got, passed, "prefix_ids" in batch.arrays


@pytest.mark.parametrize(
    "shared, old_logprobs",
    [
        ("off", "sampler"),  # the one small real check; the others ~30-80 s at load 17
        pytest.param("on", "sampler", marks=pytest.mark.slow),
        pytest.param("off", "recompute", marks=pytest.mark.slow),
    ],
)
def test_the_train_step_gives_the_separate_pass_figures(shared, old_logprobs):
    trajs = trajectories()
    got, passed, is_shared = step_parity(run_config(shared, old_logprobs), trajs)
    assert is_shared == (shared == "on")
    want_tokens = sum(m and v == VERSION for t in trajs for m, v in zip(t.loss_mask, t.versions))
    stale = sum(m and v != VERSION for t in trajs for m, v in zip(t.loss_mask, t.versions))
    assert stale > 0 and want_tokens > 0  # the older version's tokens are left out
    assert got[names.PARITY_TOKENS] == passed[names.PARITY_TOKENS] == want_tokens
    assert passed[names.PARITY_DIFF_MEAN] > 0.5  # far apart: a real comparison
    for k in (names.PARITY_DIFF_MEAN, names.PARITY_DIFF_MAX):
        assert got[k] == pytest.approx(passed[k], rel=1e-5, abs=1e-5), k


def test_several_mini_batches_keep_the_separate_pass():
    """Without recomputation the first update's forward sees one mini-batch of several:
    the trainer leaves the mask out (and the step refuses one)."""
    rc = run_config("off", mini=2 * N)
    algo = rc.algo_for_run()
    batch = make_batch(rc, algo, trajectories(), pad_id=0)
    assert batch is not None
    assert not parity.score_in_step(rc.trainer, algo, batch, VERSION)
    assert parity.PARITY_MASK not in batch.arrays
    pass_rc = dataclasses.replace(rc, trainer=dataclasses.replace(rc.trainer, parity_source="pass"))
    one = run_config("off")
    assert parity.score_in_step(one.trainer, one.algo_for_run(), batch, VERSION)
    assert not parity.score_in_step(pass_rc.trainer, one.algo_for_run(), batch, VERSION)
    model = Transformer(MODEL_CFG, nnx.Rngs(0))
    state = TrainState.create(model, optax.sgd(0.1))
    step = make_train_step(algo, state.graphdef, optax.sgd(0.1), donate=False)
    with pytest.raises(ValueError, match="parity_mask.*1 of its 2 mini-batches"):
        step(state, batch.arrays)


def test_parity_is_due_every_parity_every_steps():
    t = run_config("off").trainer
    assert [parity.due(dataclasses.replace(t, parity_every=3), v) for v in range(4)] == [
        True,
        False,
        False,
        True,
    ]
    assert not parity.due(dataclasses.replace(t, parity_every=0), 0)
    assert parity.from_step({"train/loss": 1.0, "train/parity_tokens": 0.0}) == {"train/loss": 1.0}
