"""The trainer's token pass (``train/token_stats.py``) on a tiny real model: each
trajectory's recorded trainer logprobs, entropies and off-policy weights are the train
step's, read at the train batch's own target-aligned positions; the parity metric comes
from the same pass."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from support.train import T, new_model, trajectories

from verltool_jax.algos.config import algo_config
from verltool_jax.algos.offpolicy import offpolicy_weights
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.rollout.trajectory import ENTROPY, IS_WEIGHT, TRAINER_LOGPROB
from verltool_jax.run_config import LoggingSection
from verltool_jax.train.batch import batch_from_trajectories, shift_targets
from verltool_jax.train.metrics import PAD_MULTIPLE
from verltool_jax.train.token_stats import recorded_rows, token_pass, token_weights

TEMPERATURE = 0.8


def _trajs():
    """Eight trajectories: the first four sampled by version 0 only (stale), the rest by
    version 1, the one trained; each with an observation span."""
    trajs = trajectories(0)
    for i, t in enumerate(trajs):
        t.versions = [(1 if i >= 4 else 0) if m else -1 for m in t.loss_mask]
    return trajs


@pytest.fixture(scope="module")
def model():
    return new_model(0)


def _train_batch(model, trajs):
    """The train step's batch of ``trajs`` (plain rows) and the trainer's target-aligned
    logprobs and entropies of it, scored independently of the token pass."""
    b = batch_from_trajectories(trajs, [0.0] * len(trajs), 0, T, PAD_MULTIPLE)
    ids = jnp.asarray(b["input_ids"])
    lp, ent = token_logprobs(
        model,
        ids,
        jnp.asarray(b["attention_mask"]),
        shift_targets(ids),
        temperature=TEMPERATURE,
        return_entropy=True,
    )
    return b, np.asarray(lp), np.asarray(ent)


def test_token_pass_records_what_the_train_step_sees(model):
    algo = algo_config(
        dict(
            temperature=TEMPERATURE,
            old_logprobs="recompute",
            is_mask="token",
            is_mask_low=0.5,
            is_mask_high=5.0,
            tis_cap=5.0,
        )
    )
    trajs = _trajs()
    parity = token_pass(model, trajs, 1, algo, 0, T, shared_prompt="off")
    b, lp, ent = _train_batch(model, trajs)
    # the step's weights on its own batch, with old = the recomputed logprobs
    w = np.asarray(
        offpolicy_weights(lp, b["sampler_logprobs"], b["loss_mask"], algo.offpolicy_config())
    )
    diffs, masked = [], 0
    for i, t in enumerate(trajs):  # stale trajectories are scored too
        stats = t.token_stats
        assert set(stats) == {TRAINER_LOGPROB, ENTROPY, IS_WEIGHT}
        t.check()  # every list as long as the response
        for j, m in enumerate(t.loss_mask):
            pos = len(t.prompt_ids) - 1 + j  # the position that predicts response token j
            if not m:
                assert all(stats[k][j] is None for k in stats), (i, j)
                continue
            assert stats[TRAINER_LOGPROB][j] == pytest.approx(lp[i, pos], abs=2e-5)
            assert stats[ENTROPY][j] == pytest.approx(ent[i, pos], abs=2e-5)
            assert stats[IS_WEIGHT][j] == pytest.approx(w[i, pos], abs=1e-4)
            masked += stats[IS_WEIGHT][j] == 0
            if t.versions[j] == 1:
                diffs.append(abs(lp[i, pos] - t.logprobs[j]))
    # the random sampler logprobs leave the band on some tokens, not on all
    assert 0 < masked < sum(sum(t.loss_mask) for t in trajs)
    assert parity["sync/parity_tokens"] == len(diffs) > 0
    assert parity["sync/logprob_diff_mean"] == pytest.approx(np.mean(diffs), abs=1e-4)
    assert parity["sync/logprob_diff_max"] == pytest.approx(np.max(diffs), abs=1e-4)

    # a sequence-level band masks whole trajectories, as the step's own function does
    seq = algo_config(dict(old_logprobs="recompute", is_mask="sequence", is_mask_high=2.0))
    rows = [np.asarray(t.token_stats[TRAINER_LOGPROB], dtype=object) for t in trajs]
    rows = [np.array([0.0 if x is None else x for x in r], np.float32) for r in rows]
    got = token_weights(rows, trajs, seq)
    ref = np.asarray(
        offpolicy_weights(lp, b["sampler_logprobs"], b["loss_mask"], seq.offpolicy_config())
    )
    for i, t in enumerate(trajs):
        start = len(t.prompt_ids) - 1
        kept = {float(ref[i, start + j]) for j, m in enumerate(t.loss_mask) if m}
        assert len(kept) == 1  # one weight for the whole sequence
        sampled = [float(x) for x, m in zip(got[i], t.loss_mask) if m]
        assert sampled == pytest.approx([kept.pop()] * len(sampled), abs=1e-4)


def test_the_report_rows_and_this_versions_rows_are_recorded_without_weights(model):
    """Without dumps, the pass scores the rows the report shows (the first
    ``logging.report_trajectories``) and those the parity metric needs (tokens of the
    trained version), no others. ``old_logprobs="sampler"``: the step's weight is 1 on
    every token, so none is recorded; the logprobs and entropies are."""
    trajs = _trajs()
    logging = LoggingSection(report_trajectories=2, dump_trajectories=False)
    assert recorded_rows(logging) == 2
    assert recorded_rows(LoggingSection(report_trajectories=2, dump_trajectories=True)) is None
    algo = algo_config(dict(temperature=TEMPERATURE))
    parity = token_pass(model, trajs, 1, algo, 0, T, shared_prompt="off", logging=logging)
    recorded = [i for i, t in enumerate(trajs) if t.token_stats]
    assert recorded == [0, 1, 4, 5, 6, 7]
    assert all(set(trajs[i].token_stats) == {TRAINER_LOGPROB, ENTROPY} for i in recorded)
    assert parity["sync/parity_tokens"] == sum(sum(t.loss_mask) for t in trajs[4:])
