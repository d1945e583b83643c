"""Off-policy corrections (``algos.offpolicy``): hand values of every level, the band
mask, IcePop as a setting combination, the mismatch metrics, a property test against a
float64 numpy reference, the config's rules, and the train step's use of them."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from verltool_jax import metric_names as names
from verltool_jax.algos.config import algo_config
from verltool_jax.algos.offpolicy import (
    OffPolicyConfig,
    band_mask,
    log_ratio_at_level,
    mismatch_metrics,
    offpolicy_weights,
)
from verltool_jax.algos.policy_loss import truncated_is_weights

LN2, LN3 = math.log(2.0), math.log(3.0)
# row 0: three tokens with ratios 2, 1/2, 3 (log 2, -log 2, log 3); row 1: 2 tokens + pad
OLD = jnp.array([[LN2, -LN2, LN3], [0.1, -0.2, 7.0]], jnp.float32)
SAMPLER = jnp.zeros((2, 3), jnp.float32)
MASK = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)


def test_levels_by_hand():
    tok = np.asarray(log_ratio_at_level(OLD, SAMPLER, MASK, "token"))
    np.testing.assert_allclose(tok[0], [LN2, -LN2, LN3], rtol=1e-6)
    assert tok[1, 2] == 0.0  # padding: no ratio
    seq = np.asarray(log_ratio_at_level(OLD, SAMPLER, MASK, "sequence"))
    np.testing.assert_allclose(seq[0], [LN3] * 3, rtol=1e-6)  # 2 * 1/2 * 3 = 3
    np.testing.assert_allclose(seq[1], [-0.1, -0.1, 0.0], rtol=1e-5)
    geo = np.asarray(log_ratio_at_level(OLD, SAMPLER, MASK, "geometric"))
    np.testing.assert_allclose(geo[0], [LN3 / 3] * 3, rtol=1e-6)  # 3 ** (1/3)
    np.testing.assert_allclose(geo[1], [-0.05, -0.05, 0.0], rtol=1e-5)
    with pytest.raises(ValueError, match="level"):
        log_ratio_at_level(OLD, SAMPLER, MASK, "batch")


def test_token_level_tis_is_the_existing_weight():
    w = offpolicy_weights(OLD, SAMPLER, MASK, OffPolicyConfig(tis_cap=2.5))
    ref = truncated_is_weights(OLD, SAMPLER, 2.5)
    np.testing.assert_allclose(np.asarray(w) * MASK, np.asarray(ref) * MASK, rtol=1e-6)


def test_sequence_and_geometric_weights_by_hand():
    seq = offpolicy_weights(OLD, SAMPLER, MASK, OffPolicyConfig(2.0, "sequence"))
    np.testing.assert_allclose(np.asarray(seq)[0], [2.0, 2.0, 2.0])  # min(3, 2)
    np.testing.assert_allclose(np.asarray(seq)[1, :2], [math.exp(-0.1)] * 2, rtol=1e-5)
    geo = offpolicy_weights(OLD, SAMPLER, MASK, OffPolicyConfig(2.0, "geometric"))
    np.testing.assert_allclose(np.asarray(geo)[0], [3 ** (1 / 3)] * 3, rtol=1e-5)
    assert offpolicy_weights(OLD, SAMPLER, MASK, OffPolicyConfig(tis_cap=None)) is None


def test_band_mask_and_icepop():
    lr = jnp.log(jnp.array([0.49, 0.5, 1.0, 5.0, 5.01]))
    np.testing.assert_array_equal(np.asarray(band_mask(lr, 0.5, 5.0)), [0, 1, 1, 1, 0])
    # IcePop: M(rho) = rho inside [0.5, 5], else 0
    old = jnp.log(jnp.array([[0.4, 0.5, 2.0, 4.9, 6.0]]))
    icepop = OffPolicyConfig(tis_cap=5.0, is_mask="token", is_mask_low=0.5, is_mask_high=5.0)
    w = np.asarray(offpolicy_weights(old, jnp.zeros_like(old), jnp.ones_like(old), icepop))
    np.testing.assert_allclose(w[0], [0.0, 0.5, 2.0, 4.9, 0.0], rtol=1e-5)
    # a sequence mask drops the whole row: row 0's product 3 is outside [0.5, 2]
    seq_mask = OffPolicyConfig(tis_cap=None, is_mask="sequence", is_mask_low=0.5, is_mask_high=2.0)
    w = np.asarray(offpolicy_weights(OLD, SAMPLER, MASK, seq_mask))
    np.testing.assert_array_equal(w, [[0, 0, 0], [1, 1, 1]])


def test_mismatch_metrics_by_hand():
    w = offpolicy_weights(
        OLD, SAMPLER, MASK, OffPolicyConfig(2.0, is_mask="token", is_mask_high=2.5)
    )
    m = mismatch_metrics(OLD, SAMPLER, MASK, w)
    d = np.array([LN2, -LN2, LN3, 0.1, -0.2])
    assert float(m[names.TRAIN_MISMATCH_KL_K3]) == pytest.approx(
        np.mean(np.exp(d) - 1 - d), rel=1e-5
    )
    assert float(m[names.TRAIN_MISMATCH_KL_K1]) == pytest.approx(np.mean(-d), abs=1e-6)
    assert float(m[names.TRAIN_OFFPOLICY_MASKED_FRAC]) == pytest.approx(1 / 5)  # ratio 3
    assert float(m[names.TRAIN_MISMATCH_RATIO_MAX]) == pytest.approx(3.0, rel=1e-5)
    zero = mismatch_metrics(SAMPLER, SAMPLER, MASK)
    assert float(zero[names.TRAIN_MISMATCH_KL_K3]) == 0.0
    assert float(zero[names.TRAIN_OFFPOLICY_MASKED_FRAC]) == 0.0


def _reference(old, sampler, mask, cap, level, mask_level, lo, hi):
    """float64 numpy, row by row, from the module docstring's formulas."""
    out = np.ones_like(old)
    for b in range(old.shape[0]):
        m = mask[b] > 0
        d = np.clip(old[b] - sampler[b], -20, 20)
        n = max(m.sum(), 1)

        def at(lvl, d=d, m=m, n=n):
            if lvl == "token":
                return d
            s = d[m].sum() / (n if lvl == "geometric" else 1)
            return np.full_like(d, np.clip(s, -20, 20))

        w = np.minimum(np.exp(at(level)), cap) if cap else np.ones_like(d)
        if mask_level != "off":
            r = at(mask_level)
            w = w * ((r >= np.log(lo)) & (r <= np.log(hi)))
        out[b] = w
    return out


@pytest.mark.parametrize("mask_level", ["off", "token", "sequence", "geometric"])
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("cap", [None, 1.5, 5.0])
@pytest.mark.parametrize("seed", range(4))
def test_weights_match_a_float64_reference(seed, cap, level, mask_level):
    """Property: on random batches, every combination agrees with float64 numpy and the
    weight lies in [0, cap]."""
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.0, 1.0, (3, 6))
    sampler = old + rng.normal(0.0, 0.3, (3, 6))
    mask = (rng.random((3, 6)) < 0.7).astype(np.float64)
    cfg = OffPolicyConfig(cap, level, mask_level, 0.7, 1.4)
    got = offpolicy_weights(
        jnp.asarray(old, jnp.float32), jnp.asarray(sampler, jnp.float32), jnp.asarray(mask), cfg
    )
    ref = _reference(old, sampler, mask, cap, level, mask_level, 0.7, 1.4)
    if got is None:
        assert cap is None and mask_level == "off"
        return
    got = np.asarray(got)
    assert np.all(got >= 0) and (cap is None or np.all(got <= cap + 1e-6))
    # away from the band's edges (float32 vs float64 may fall either side of them)
    near = np.zeros_like(mask, bool)
    if mask_level != "off":
        for lvl in (mask_level,):
            r = np.asarray(log_ratio_at_level(jnp.asarray(old), jnp.asarray(sampler), mask, lvl))
            near = (np.abs(r - np.log(0.7)) < 1e-4) | (np.abs(r - np.log(1.4)) < 1e-4)
    sel = (mask > 0) & ~near
    np.testing.assert_allclose(got[sel], ref[sel], rtol=1e-4, atol=1e-6)


def test_config_rules():
    with pytest.raises(ValueError, match="is_mask_low"):
        OffPolicyConfig(is_mask_low=2.0, is_mask_high=1.5)
    with pytest.raises(ValueError, match="tis_level"):
        OffPolicyConfig(tis_level="batch")
    with pytest.raises(ValueError, match="algo.is_mask"):
        algo_config({"is_mask": "row"})
    with pytest.raises(ValueError, match="old_logprobs='recompute'"):
        algo_config({"tis_level": "sequence"})  # the sampler's logprobs: every ratio is 1
    cfg = algo_config({"old_logprobs": "recompute", "is_mask": "geometric", "tis_cap": 0})
    assert cfg.offpolicy_config() == OffPolicyConfig(None, "token", "geometric", 0.5, 5.0)
    assert cfg.reads_behaviour_logprobs
    off = algo_config({"old_logprobs": "recompute", "tis_cap": 0})
    assert not off.reads_behaviour_logprobs
