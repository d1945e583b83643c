"""The train step's off-policy wiring on a tiny real Transformer: with a truncating
sampler the trainer scores the sampled tokens under the same truncation (no mismatch
left), without it the mismatch shows; the mismatch metrics and the masked fraction."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from support.train import batch, new_state

from verltool_jax import metric_names as names
from verltool_jax.algos.aggregation import normaliser_for
from verltool_jax.algos.config import algo_config
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.train.batch import shift_targets
from verltool_jax.train.step import make_loss_fn

TOP_K, TOP_P = 5, 0.9


@pytest.fixture(scope="module")
def setup():
    state = new_state("gspo_whole")
    bt = {k: jnp.asarray(v) for k, v in batch(0).items()}
    ids, attn = bt["input_ids"], bt["attention_mask"]
    # what a truncating sampler reports: logprobs renormalised over its kept set
    bt["sampler_logprobs"] = token_logprobs(
        state.model(), ids, attn, shift_targets(ids), top_k=TOP_K, top_p=TOP_P
    )
    return state, bt


def _metrics(state, bt, **algo):
    cfg = algo_config(dict(old_logprobs="recompute", top_k=TOP_K, top_p=TOP_P, **algo))
    b = dict(bt)
    b["old_logprobs"] = token_logprobs(  # the step's recomputation, under its settings
        state.model(),
        b["input_ids"],
        b["attention_mask"],
        shift_targets(b["input_ids"]),
        **cfg.truncation(),
    )
    loss_fn = make_loss_fn(cfg, state.graphdef, token_logprobs)
    return {
        k: float(v) for k, v in loss_fn(state.params, b, normaliser_for(b["loss_mask"]))[1].items()
    }


def test_truncated_trainer_logprobs_remove_the_truncation_bias(setup):
    state, bt = setup
    m = _metrics(state, bt, tis_cap=2.0)
    assert m[names.TRAIN_MISMATCH_KL_K3] == pytest.approx(0.0, abs=1e-6)
    assert m[names.TRAIN_MISMATCH_RATIO_MAX] == pytest.approx(1.0, abs=1e-4)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # logp and old agree too
    # untruncated trainer logprobs: every kept token looks less likely to the trainer
    off = _metrics(state, bt, tis_cap=2.0, truncated_logprobs=False)
    assert off[names.TRAIN_MISMATCH_KL_K3] > 1e-3
    assert off[names.TRAIN_MISMATCH_KL_K1] > 1e-3
    assert off[names.TRAIN_MISMATCH_RATIO_MAX] <= 1.0 + 1e-5
    assert off["tis_weight_mean"] < 1.0


def test_a_mask_band_is_counted_as_masked(setup):
    state, bt = setup
    # untruncated trainer vs truncated sampler: ratios below 1; a band [0.99, 1.01]
    # masks the tokens whose kept set had much mass outside it
    m = _metrics(
        state,
        bt,
        tis_cap=0.0,
        is_mask="token",
        is_mask_low=0.99,
        is_mask_high=1.01,
        truncated_logprobs=False,
    )
    assert 0.0 < m[names.TRAIN_OFFPOLICY_MASKED_FRAC] <= 1.0
    seq = _metrics(
        state,
        bt,
        tis_cap=0.0,
        is_mask="sequence",
        is_mask_low=0.99,
        is_mask_high=1.01,
        truncated_logprobs=False,
    )
    assert seq[names.TRAIN_OFFPOLICY_MASKED_FRAC] >= m[names.TRAIN_OFFPOLICY_MASKED_FRAC]
