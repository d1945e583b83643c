"""Advantages, policy losses, KL, aggregation and DAPO helpers vs hand-computed values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from verltool_jax.algos import (
    PolicyLossConfig,
    aggregate,
    broadcast_to_tokens,
    compute_advantages,
    get_advantage_fn,
    get_kl_fn,
    get_policy_loss,
    informative_groups,
    normaliser_for,
    overlong_penalty,
    truncated_is_weights,
)
from verltool_jax.algos.kl import entropy_from_logits

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 5.0]
GROUPS = ["a", "a", "a", "a", "b", "b", "b", "c"]


def test_grpo_hand_values_all_equal_and_singleton():
    adv = compute_advantages("grpo", REWARDS, GROUPS)
    s = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1,0,0,1]
    want = 0.5 / (s + 1e-6)
    np.testing.assert_allclose(adv[:4], [want, -want, -want, want], rtol=1e-6)
    np.testing.assert_array_equal(adv[4:7], 0.0)  # all-equal group: no signal
    assert adv[7] == 0.0  # group of one gets 0
    assert adv.dtype == np.float32


ESTIMATORS = ("grpo", "drgrpo", "rloo")


@pytest.mark.parametrize("name", ESTIMATORS)
def test_all_equal_group_is_exactly_zero_for_inexact_floats(name):
    """Rewards whose float32 group mean is not the reward itself (123.456 x 16: the mean
    is one ulp off and plain GRPO gives about -0.93) still get exactly 0."""
    cases = [(123.456, 16), (-0.7, 11), (0.1, 3), (1e-30, 7), (-3.4e38, 5), (7.0, 2)]
    rewards, gids = [], []
    for k, (value, n) in enumerate(cases):
        rewards += [value] * n
        gids += [k] * n
    adv = compute_advantages(name, rewards + [0.0, 1.0], gids + ["mixed", "mixed"])
    assert np.all(adv[:-2] == 0.0), adv[:-2]
    assert adv[-2] < 0 < adv[-1]


def test_all_equal_groups_property_random_floats():
    """Random batches of 8 groups (random sizes 2..), each all-equal with a random float
    reward (random sign and magnitude) or mixed: the all-equal ones are exactly 0 in every
    estimator, and the mixed ones match the formulas evaluated in float64."""
    rng = np.random.default_rng(1234)
    n_total, n_groups = 64, 8
    fns = {name: jax.jit(get_advantage_fn(name), static_argnums=2) for name in ESTIMATORS}
    for trial in range(60):
        cuts = np.sort(rng.choice(np.arange(1, n_total // 2), n_groups - 1, replace=False)) * 2
        sizes = np.diff(np.concatenate([[0], cuts, [n_total]]))
        gidx = np.repeat(np.arange(n_groups), sizes).astype(np.int32)
        rewards = np.zeros(n_total, np.float32)
        equal = np.zeros(n_total, bool)
        for g in range(n_groups):
            sel = gidx == g
            if rng.random() < 0.5:
                rewards[sel] = np.float32(rng.normal() * 10.0 ** rng.integers(-6, 7))
                equal[sel] = True
            else:
                rewards[sel] = rng.normal(size=sel.sum()) * 10.0 ** rng.integers(-2, 3)
        for name, fn in fns.items():
            adv = np.asarray(fn(jnp.asarray(rewards), jnp.asarray(gidx), n_groups))
            assert np.all(adv[equal] == 0.0), (trial, name, adv[equal])
            want = np.zeros(n_total)
            for g in range(n_groups):
                sel = gidx == g
                r = rewards[sel].astype(np.float64)
                if name == "grpo":
                    want[sel] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
                elif name == "drgrpo":
                    want[sel] = r - r.mean()
                else:
                    want[sel] = r - (r.sum() - r) / (len(r) - 1)
            if (~equal).any():
                scale = np.abs(want[~equal]).max()
                np.testing.assert_allclose(adv[~equal], want[~equal], rtol=1e-4, atol=1e-5 * scale)


def test_grpo_inexact_rewards_hand_values():
    # r = [0.1, 0.2, 0.3]: mean 0.2, unbiased std 0.1 -> A = [-0.1, 0, 0.1] / (0.1 + 1e-6)
    adv = compute_advantages("grpo", [0.1, 0.2, 0.3], ["g"] * 3)
    np.testing.assert_allclose(adv, np.array([-0.1, 0, 0.1]) / (0.1 + 1e-6), rtol=1e-5, atol=1e-6)
    # rloo: 0.1 - (0.5 / 2) = -0.15; 0.2 - 0.2 = 0; 0.3 - 0.15 = 0.15
    np.testing.assert_allclose(
        compute_advantages("rloo", [0.1, 0.2, 0.3], ["g"] * 3), [-0.15, 0.0, 0.15], atol=1e-6
    )


def test_drgrpo_and_rloo_hand_values():
    dr = compute_advantages("drgrpo", REWARDS, GROUPS)
    np.testing.assert_allclose(dr, [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], atol=1e-7)
    rl = compute_advantages("rloo", REWARDS, GROUPS)
    np.testing.assert_allclose(rl, [1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3, 0, 0, 0, 0], atol=1e-6)
    # RLOO = n/(n-1) * (r - mean)
    np.testing.assert_allclose(rl[:4], dr[:4] * 4 / 3, atol=1e-6)


def test_advantages_jit_with_int_groups_and_unknown_name():
    fn = jax.jit(get_advantage_fn("grpo"), static_argnums=2)
    out = fn(jnp.array([2.0, 4.0, 3.0, 3.0]), jnp.array([1, 1, 0, 0]), 2)
    np.testing.assert_allclose(
        out, [-1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6), 0, 0], rtol=1e-6
    )
    with pytest.raises(ValueError, match="algo.adv_estimator.*grpo"):
        get_advantage_fn("ppo-gae")
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages("grpo", [1.0, float("nan")], ["a", "a"])


def test_broadcast_to_tokens():
    out = broadcast_to_tokens(jnp.array([2.0, -1.0]), jnp.array([[0, 1, 1], [1, 0, 0]]))
    np.testing.assert_array_equal(out, [[0, 2, 2], [-1, 0, 0]])


# ----------------------------------------------------------------- aggregation
L = jnp.array([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [7.0, 7.0, 7.0, 7.0]])
M = jnp.array([[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]])  # row 3 fully masked


@pytest.mark.parametrize(
    "mode,want",
    [
        ("token-mean", (1 + 2 + 3 + 20) / 4),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 20 / 1) / 2),
        ("seq-mean-token-sum", (6 + 20) / 2),
        ("seq-mean-token-sum-norm", (6 + 20) / 4),  # verl agg_loss: sum of seq sums / T
    ],
)
def test_aggregation_hand_values(mode, want):
    assert float(aggregate(L, M, mode)) == pytest.approx(want)


def test_aggregation_norm_constant_all_masked_and_nan_in_padding():
    assert float(aggregate(L, M, "seq-mean-token-sum-norm", norm_constant=13.0)) == pytest.approx(
        26 / 13
    )
    bad = L.at[2, 0].set(jnp.nan).at[0, 3].set(jnp.inf)  # only on masked positions
    assert float(aggregate(bad, M, "token-mean")) == pytest.approx(26 / 4)
    for mode in (
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    ):
        assert float(aggregate(L, jnp.zeros_like(M), mode)) == 0.0
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(L, M, "mean")


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_aggregation_micro_batches_sum_to_global(mode):
    """With the global normaliser, per-micro-batch aggregates add up to the whole-batch one."""
    rng = np.random.default_rng(0)
    loss = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
    mask = jnp.asarray(rng.integers(0, 2, size=(6, 5)))
    mask = mask.at[4].set(0)
    whole = aggregate(loss, mask, mode)
    norm = normaliser_for(mask)
    parts = sum(aggregate(loss[i : i + 2], mask[i : i + 2], mode, norm, 5.0) for i in (0, 2, 4))
    assert float(parts) == pytest.approx(float(whole), rel=1e-6)
    # ... whereas a mean of micro-batch means differs (uneven token counts)
    naive = sum(aggregate(loss[i : i + 2], mask[i : i + 2], mode) for i in (0, 2, 4)) / 3
    if mode == "token-mean":
        assert float(naive) != pytest.approx(float(whole), rel=1e-3)


# ----------------------------------------------------------------- policy losses
def _ppo_case():
    # tokens: (A, log ratio) -> hand loss, clipped, dual
    A = jnp.array([[1.0, -1.0, -1.0, 1.0]])
    lr = jnp.array([[0.5, math.log(5.0), math.log(0.5), 0.0]])
    logp = jnp.array([[-1.0, -2.0, -3.0, -0.5]])
    return A, logp, logp - lr


def test_ppo_clip_higher_and_dual_clip_hand_values():
    A, logp, old = _ppo_case()
    mask = jnp.ones_like(logp)
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, dual_clip_c=3.0)
    loss, m = get_policy_loss("ppo")(logp, old, A, mask, cfg)
    # token 1: A=1, r=e^.5=1.6487 -> max(-1.6487, -1.28) = -1.28 (clipped)
    # token 2: A=-1, r=5 -> max(5, 1.2) = 5 -> dual clip min(5, 3) = 3
    # token 3: A=-1, r=.5 -> max(.5, .8) = .8 (clipped)
    # token 4: A=1, r=1 -> -1
    want = [-1.28, 3.0, 0.8, -1.0]
    assert float(loss) == pytest.approx(sum(want) / 4, rel=1e-5)
    assert float(m["pg_clipfrac"]) == pytest.approx(2 / 4)
    assert float(m["pg_clipfrac_lower"]) == pytest.approx(1 / 4)
    assert float(m["ratio_max"]) == pytest.approx(5.0, rel=1e-5)
    assert float(m["ratio_min"]) == pytest.approx(0.5, rel=1e-5)
    ratios = [math.exp(0.5), 5.0, 0.5, 1.0]
    assert float(m["ratio_mean"]) == pytest.approx(sum(ratios) / 4, rel=1e-5)
    assert float(m["ppo_kl"]) == pytest.approx(-(0.5 + math.log(5) + math.log(0.5)) / 4, rel=1e-5)
    # without dual clip token 2 costs 5
    loss2, m2 = get_policy_loss("ppo")(logp, old, A, mask, PolicyLossConfig(0.2, 0.28, None))
    assert float(loss2) == pytest.approx((-1.28 + 5 + 0.8 - 1) / 4, rel=1e-5)
    assert float(m2["pg_clipfrac_lower"]) == 0.0


def test_ppo_gradient_hand_value_and_zero_when_clipped():
    A, logp, old = _ppo_case()
    mask = jnp.array([[1.0, 1.0, 1.0, 1.0]])
    cfg = PolicyLossConfig(0.2, 0.28, 3.0)
    g = jax.grad(lambda lp: get_policy_loss("ppo")(lp, old, A, mask, cfg)[0])(logp)
    # only token 4 is unclipped: d(-A r)/dlogp = -A r = -1, / 4 tokens
    np.testing.assert_allclose(g, [[0, 0, 0, -0.25]], atol=1e-6)


def test_ppo_masked_tokens_and_truncated_is_weight():
    A, logp, old = _ppo_case()
    mask = jnp.array([[1.0, 0.0, 0.0, 1.0]])
    loss, _ = get_policy_loss("ppo")(logp, old, A, mask)
    assert float(loss) == pytest.approx((-1.2 - 1.0) / 2, rel=1e-5)  # default eps .2/.2
    sampler = old - jnp.array([[math.log(4.0), 0, 0, math.log(1.5)]])  # old - sampler
    w = truncated_is_weights(old, sampler, cap=2.0)
    np.testing.assert_allclose(w, [[2.0, 1, 1, 1.5]], rtol=1e-6)
    loss_w, m = get_policy_loss("ppo")(logp, old, A, mask, is_weights=w)
    assert float(loss_w) == pytest.approx((-1.2 * 2 - 1.0 * 1.5) / 2, rel=1e-5)
    assert float(m["tis_weight_mean"]) == pytest.approx((2 + 1.5) / 2)
    with pytest.raises(ValueError, match="tis_cap"):
        truncated_is_weights(old, sampler, cap=0.0)


def test_ppo_log_ratio_clamped_no_overflow():
    logp = jnp.array([[0.0]])
    old = jnp.array([[-100.0]])
    loss, m = get_policy_loss("ppo")(
        logp, old, jnp.array([-1.0]), jnp.ones((1, 1)), PolicyLossConfig(dual_clip_c=None)
    )
    assert float(m["ratio_max"]) == pytest.approx(math.exp(20), rel=1e-5)
    assert np.isfinite(float(loss))


def test_gspo_sequence_ratio_hand_values_and_gradient():
    logp = jnp.array([[-1.0, -1.0, -5.0], [-2.0, -2.0, -2.0]])
    old = logp - jnp.array([[0.2, 0.4, 9.0], [0.05, -0.05, 0.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    A = jnp.array([1.0, -2.0])
    cfg = PolicyLossConfig(0.2, 0.28, None, "seq-mean-token-mean")
    fn = get_policy_loss("gspo")
    loss, m = fn(logp, old, A, mask, cfg)
    s0 = math.exp(0.3)  # row 0: mean log ratio 0.3 -> 1.3499 > 1.28: clipped -> -1.28
    s1 = math.exp(0.0)  # row 1: ratio 1 -> -(-2) * 1 = 2
    assert s0 > 1.28
    assert float(loss) == pytest.approx((-1.28 + 2.0) / 2, rel=1e-5)
    assert float(m["pg_clipfrac"]) == pytest.approx(2 / 5)
    g = jax.grad(lambda lp: fn(lp, old, A, mask, cfg)[0])(logp)
    # row 0 clipped -> 0; row 1: d/dlogp_t of -A s (token t) = 2 * s1, / 3 tokens / 2 seqs
    np.testing.assert_allclose(g, [[0, 0, 0], [2 * s1 / 6] * 3], atol=1e-6)


def test_gspo_log_ratio_clamped_at_10_without_gradient_and_seq_mean_token_mean():
    """verl compute_policy_loss_gspo: log s <= 10 (zero gradient where clamped), and the
    loss is seq-mean-token-mean even when loss_agg_mode says otherwise."""
    d = jnp.array([[12.0, 12.0, 0.0], [0.1, 0.1, 0.1]])  # row 0: mean log ratio 12 > 10
    logp = jnp.array([[-1.0, -2.0, -3.0], [-1.0, -1.5, -0.5]])
    old = logp - d
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    A = jnp.array([-1.0, -1.0])
    cfg = PolicyLossConfig(0.2, 0.28, None, "token-mean")
    fn = get_policy_loss("gspo")
    loss, m = fn(logp, old, A, mask, cfg)
    # row 0: s = e^10 (not e^12), l = max(e^10, 1.28) = e^10 on both tokens -> seq mean e^10
    # row 1: s = e^0.1 inside [0.8, 1.28] -> l = e^0.1 on each token
    want = (math.exp(10.0) + math.exp(0.1)) / 2  # seq-mean-token-mean
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert float(loss) != pytest.approx((2 * math.exp(10) + 3 * math.exp(0.1)) / 5, rel=1e-3)
    assert float(m["ratio_max"]) == pytest.approx(math.exp(10.0), rel=1e-5)
    assert float(m["ppo_kl"]) == pytest.approx(-(12 + 12 + 0.3) / 5, rel=1e-5)
    assert float(m["pg_clipfrac_lower"]) == 0.0
    g = jax.grad(lambda lp: fn(lp, old, A, mask, cfg)[0])(logp)
    # row 0 clamped -> 0; row 1: d(-A s)/dlogp_t = s = e^0.1, / 3 tokens / 2 seqs
    np.testing.assert_allclose(g, [[0, 0, 0], [math.exp(0.1) / 6] * 3], rtol=1e-5)
    # just under the clamp the gradient flows
    d2 = d.at[0, :2].set(9.5)
    g2 = jax.grad(lambda lp: fn(lp, logp - d2, A, mask, cfg)[0])(logp)
    np.testing.assert_allclose(g2[0, :2], [math.exp(9.5) / 4] * 2, rtol=1e-5)


def test_clamp_gradient_is_torch_clamp_at_the_bounds():
    """clip bounds pass the whole gradient (torch.clamp), outside it is 0."""
    from verltool_jax.algos.policy_loss import clamp

    g = jax.grad(lambda x: clamp(x, 0.8, 1.28).sum())(jnp.array([0.5, 0.8, 1.0, 1.28, 2.0]))
    np.testing.assert_array_equal(g, [0, 1, 1, 1, 0])
    np.testing.assert_array_equal(clamp(jnp.array([-1.0, 11.0]), high=10.0), [-1.0, 10.0])


def test_policy_loss_config_validation():
    with pytest.raises(ValueError, match="dual_clip_c"):
        PolicyLossConfig(dual_clip_c=0.5)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        PolicyLossConfig(clip_ratio_low=-0.5)  # >= 1 is allowed: no lower bound
    with pytest.raises(ValueError, match="loss_agg_mode"):
        PolicyLossConfig(loss_agg_mode="sum")
    with pytest.raises(ValueError, match="algo.policy_loss"):
        get_policy_loss("trpo")


# ----------------------------------------------------------------- KL / entropy
def test_kl_estimators_hand_values_and_clamps():
    logp = jnp.array([-1.0, -2.0, 0.0, -40.0])
    ref = jnp.array([-1.5, -1.0, -30.0, 0.0])
    d = np.array([0.5, -1.0, 30.0, -40.0])
    np.testing.assert_allclose(get_kl_fn("k1")(logp, ref), d)
    np.testing.assert_allclose(get_kl_fn("k2")(logp, ref), d**2 / 2)
    np.testing.assert_allclose(get_kl_fn("abs")(logp, ref), np.abs(d))
    k3 = np.asarray(get_kl_fn("low_var_kl")(logp, ref))
    np.testing.assert_allclose(k3[:2], np.exp(-d[:2]) + d[:2] - 1, rtol=1e-6)
    # d = 30: r = -30 -> clamp -20 -> exp(-20) + 20 - 1 = 19 -> clamp 10
    assert k3[2] == pytest.approx(10.0)
    # d = -40: r = 40 -> clamp 20 -> exp(20) ... -> clamp 10
    assert k3[3] == pytest.approx(10.0)
    assert float(get_kl_fn("k3")(jnp.array(-1.0), jnp.array(-1.0))) == 0.0
    with pytest.raises(ValueError, match="kl_estimator"):
        get_kl_fn("k4")


def test_entropy_from_logits():
    h = entropy_from_logits(jnp.array([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]))
    np.testing.assert_allclose(h, [math.log(4), 0.0], atol=1e-5)


# ----------------------------------------------------------------- DAPO
def test_dynamic_sampling_drops_uninformative_groups():
    keep = informative_groups(REWARDS, GROUPS)
    np.testing.assert_array_equal(keep, [1, 1, 1, 1, 0, 0, 0, 0])
    keep = informative_groups([0.5, 0.5000001, 1.0, 1.0], ["x", "x", "y", "y"], atol=1e-3)
    np.testing.assert_array_equal(keep, [0, 0, 0, 0])
    with pytest.raises(ValueError, match="one entry per group id"):
        informative_groups([1.0], ["a", "b"])


def test_overlong_penalty_hand_values():
    out = overlong_penalty(
        [10, 80, 90, 100, 101, 0], max_length=100, cache_length=20, penalty_factor=1.0
    )
    np.testing.assert_allclose(out, [0, 0, -0.5, -1.0, -1.0, 0])
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        overlong_penalty([1], max_length=10, cache_length=0)
