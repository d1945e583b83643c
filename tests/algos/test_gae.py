"""GAE, returns and the clipped value loss (algos.gae) against hand values and a
straightforward numpy reference of verl's formulas."""

import jax.numpy as jnp
import numpy as np
import pytest

from verltool_jax.algos.config import algo_config
from verltool_jax.algos.gae import (
    explained_variance,
    gae_advantages_returns,
    masked_whiten,
    outcome_token_rewards,
    value_loss,
)


def reference_gae(rewards, values, mask, gamma, lam):
    """GAE row by row over the list of sampled positions only (the observation tokens
    dropped, as if the sequence were the model's tokens alone): verl's recursion."""
    adv = np.zeros_like(values, dtype=np.float64)
    for b in range(values.shape[0]):
        idx = np.flatnonzero(mask[b] > 0)
        next_v, next_a = 0.0, 0.0
        for t in idx[::-1]:
            delta = rewards[b, t] + gamma * next_v - values[b, t]
            next_a = delta + gamma * lam * next_a
            next_v = values[b, t]
            adv[b, t] = next_a
    returns = (adv + values) * (mask > 0)
    return adv, returns


def _gae(r, v, m, gamma, lam):
    a, ret = gae_advantages_returns(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), gamma, lam)
    return np.asarray(a), np.asarray(ret)


def test_hand_values_with_an_observation_span():
    # positions 0..5: sampled, sampled, obs, obs, sampled, padding
    mask = np.array([[1, 1, 0, 0, 1, 0]], np.float32)
    values = np.array([[0.5, 0.2, 9.0, 9.0, 0.4, 7.0]], np.float32)
    rewards = np.array([[0, 0, 0, 0, 1.0, 0]], np.float32)
    adv, ret = _gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=4: delta = 1 - 0.4 = 0.6, A = 0.6
    # t=1: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16, A = 0.16 + 0.45 * 0.6 = 0.43
    # t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32, A = -0.32 + 0.45 * 0.43 = -0.1265
    want = np.array([[-0.1265, 0.43, 0, 0, 0.6, 0]], np.float32)
    np.testing.assert_allclose(adv, want, atol=1e-6)
    np.testing.assert_allclose(ret, (want + values) * mask, atol=1e-6)


def test_reward_lands_on_the_last_sampled_token():
    mask = jnp.asarray([[0, 1, 1, 0, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0]], jnp.float32)
    r = np.asarray(outcome_token_rewards(jnp.asarray([2.0, -1.0, 5.0]), mask))
    np.testing.assert_array_equal(r, [[0, 0, 2.0, 0, 0], [0, 0, 0, 0, -1.0], [0, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="rewards must be"):
        outcome_token_rewards(jnp.zeros(2), mask)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.7, 0.0), (1.0, 0.3)])
def test_matches_the_reference(seed, gamma, lam):
    rng = np.random.default_rng(seed)
    B, T = 5, 12
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    values = rng.normal(size=(B, T)).astype(np.float32)
    rewards = np.array(
        outcome_token_rewards(jnp.asarray(rng.normal(size=B).astype(np.float32)), mask)
    )
    rewards += rng.normal(size=(B, T)).astype(np.float32) * mask  # dense rewards too
    adv, ret = _gae(rewards, values, mask, gamma, lam)
    want_adv, want_ret = reference_gae(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_lambda_one_gamma_one_returns_are_the_reward_to_go(seed):
    rng = np.random.default_rng(seed)
    B, T = 4, 10
    mask = (rng.random((B, T)) < 0.6).astype(np.float32)
    values = rng.normal(size=(B, T)).astype(np.float32)
    dense = rng.normal(size=(B, T)).astype(np.float32) * mask
    adv, ret = _gae(dense, values, mask, 1.0, 1.0)
    # reward-to-go: the sum of the rewards at this sampled token and after it
    to_go = np.cumsum(dense[:, ::-1], axis=1)[:, ::-1] * mask
    np.testing.assert_allclose(ret, to_go, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, (to_go - values) * mask, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_lambda_zero_is_the_one_step_td_error(gamma):
    rng = np.random.default_rng(7)
    B, T = 3, 9
    mask = (rng.random((B, T)) < 0.6).astype(np.float32)
    mask[:, 0] = 1
    values = rng.normal(size=(B, T)).astype(np.float32)
    dense = rng.normal(size=(B, T)).astype(np.float32) * mask
    adv, _ = _gae(dense, values, mask, gamma, 0.0)
    for b in range(B):
        idx = np.flatnonzero(mask[b])
        nxt = np.append(values[b, idx[1:]], 0.0)  # the next sampled token's value (end: 0)
        td = dense[b, idx] + gamma * nxt - values[b, idx]
        np.testing.assert_allclose(adv[b, idx], td, rtol=1e-5, atol=1e-6)


def test_bad_gamma_is_an_error():
    z = jnp.zeros((1, 3))
    with pytest.raises(ValueError, match="gamma and lambda"):
        gae_advantages_returns(z, z, z, 1.5, 1.0)
    with pytest.raises(ValueError, match="one shape"):
        gae_advantages_returns(z, jnp.zeros((1, 4)), z, 1.0, 1.0)


def test_masked_whiten_hand_values():
    x = jnp.asarray([[1.0, 2.0, 100.0], [3.0, 0.0, 0.0]])
    m = jnp.asarray([[1, 1, 0], [1, 0, 0]], jnp.float32)
    # masked: 1, 2, 3 -> mean 2, unbiased var 1
    out = np.asarray(masked_whiten(x, m))
    s = 1 / np.sqrt(1 + 1e-8)
    np.testing.assert_allclose(out, [[-s, 0, 0], [s, 0, 0]], rtol=1e-6)
    assert np.all(np.asarray(masked_whiten(x, m * 0)) == 0)  # no tokens: all 0


def test_value_loss_hand_values():
    # one row, 3 sampled tokens and a masked one; clip c = 0.5 around the old values
    old = jnp.asarray([[0.0, 0.0, 1.0, 0.0]])
    new = jnp.asarray([[1.0, 0.2, 0.0, 9.0]])
    ret = jnp.asarray([[2.0, 0.0, 0.0, 0.0]])
    m = jnp.asarray([[1, 1, 1, 0]], jnp.float32)
    loss, met = value_loss(new, old, ret, m, 0.5)
    # t0: unclipped (1-2)^2 = 1, clipped (0.5-2)^2 = 2.25 -> 2.25 (clipped larger)
    # t1: |0.2| <= 0.5: both 0.04 -> 0.04
    # t2: unclipped 0, clipped (0.5-0)^2 = 0.25 -> 0.25 (clipped larger)
    np.testing.assert_allclose(float(loss), 0.5 * (2.25 + 0.04 + 0.25) / 3, rtol=1e-6)
    np.testing.assert_allclose(float(met["vf_clipfrac"]), 2 / 3, rtol=1e-6)
    loss0, met0 = value_loss(new, old, ret, m, None)
    np.testing.assert_allclose(float(loss0), 0.5 * (1 + 0.04 + 0) / 3, rtol=1e-6)
    assert float(met0["vf_clipfrac"]) == 0.0


def test_explained_variance():
    ret = jnp.asarray([[1.0, 2.0, 3.0, 50.0]])
    m = jnp.asarray([[1, 1, 1, 0]], jnp.float32)
    assert abs(float(explained_variance(ret, ret, m)) - 1.0) < 1e-6
    mean = jnp.full_like(ret, 2.0)  # predicting the mean explains nothing
    assert abs(float(explained_variance(ret, mean, m))) < 1e-4


def test_config_fields_and_errors():
    cfg = algo_config(adv_estimator="gae", critic_lr=3e-4)
    assert cfg.uses_critic and (cfg.gamma, cfg.lam, cfg.value_clip) == (1.0, 1.0, 0.5)
    from verltool_jax.algos.optimizer import optimizer_config

    optim = optimizer_config(lr=1e-5, warmup_steps=3, max_grad_norm=2.0)
    crit = cfg.critic_optimizer_config(optim)
    assert (crit.lr, crit.warmup_steps, crit.max_grad_norm) == (3e-4, 3, 2.0)
    for bad, match in [
        (dict(lam=1.5), "algo.lam"),
        (dict(gamma=-0.1), "algo.gamma"),
        (dict(critic_lr=0.0), "algo.critic_lr"),
        (dict(value_clip=-1.0), "algo.value_clip"),
        (dict(adv_estimator="gae", turn_discount=0.5), "turn_discount"),
        (dict(adv_estimator="gea"), "adv_estimator"),
    ]:
        with pytest.raises(ValueError, match=match):
            algo_config(**bad)
