"""REINFORCE++ (and its baseline variant), CISPO and per-turn credit vs hand values and
vs verl's token-level formulas re-derived here in float64 numpy."""

import asyncio
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from verltool_jax.algos import PolicyLossConfig, compute_advantages, get_policy_loss
from verltool_jax.algos.advantages import GROUP_ESTIMATORS, get_advantage_fn, token_whiten
from verltool_jax.algos.credit import (
    turn_discount_weights,
    turn_discounted_advantages,
    turn_index,
)

RFPP = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")


# ------------------------------------------------------------------ REINFORCE++
def test_reinforce_pp_hand_values_token_weighted():
    # r = [1, 0, 0, 1] on 2, 1, 3, 4 tokens: N = 10, mu = (2 + 4) / 10 = 0.6,
    # var = (2 * .16 + 1 * .36 + 3 * .36 + 4 * .16) / 9 = 2.4 / 9
    adv = compute_advantages(
        "reinforce_plus_plus", [1.0, 0.0, 0.0, 1.0], list("aabb"), [2, 1, 3, 4]
    )
    s = math.sqrt(2.4 / 9 + 1e-8)
    np.testing.assert_allclose(adv, [0.4 / s, -0.6 / s, -0.6 / s, 0.4 / s], rtol=1e-5)
    # the same rewards with equal lengths: the sequence mean 0.5, var = 4*.25*n/(4n-1)
    adv_eq = compute_advantages("reinforce_plus_plus", [1.0, 0.0, 0.0, 1.0], list("abcd"), [3] * 4)
    s_eq = math.sqrt(12 * 0.25 / 11 + 1e-8)
    np.testing.assert_allclose(
        adv_eq, [0.5 / s_eq, -0.5 / s_eq, -0.5 / s_eq, 0.5 / s_eq], rtol=1e-5
    )
    assert adv.dtype == np.float32


def test_reinforce_pp_baseline_hand_values_and_singleton():
    # groups a = [1, 0], b = [0, 1], c = [5] (lone): centred [.5, -.5, -.5, .5, 0]
    # tokens [2, 1, 3, 4, 2]: N = 12, mu = (1 - .5 - 1.5 + 2 + 0) / 12 = 1 / 12
    r, g, n = [1.0, 0.0, 0.0, 1.0, 5.0], list("aabbc"), [2, 1, 3, 4, 2]
    adv = compute_advantages("reinforce_plus_plus_baseline", r, g, n)
    c = np.array([0.5, -0.5, -0.5, 0.5, 0.0])
    w = np.array(n, float)
    mu = (w * c).sum() / w.sum()
    assert mu == pytest.approx(1 / 12)
    var = (w * (c - mu) ** 2).sum() / (w.sum() - 1)
    np.testing.assert_allclose(adv, (c - mu) / math.sqrt(var + 1e-8), rtol=1e-5)
    # the lone sample is centred to 0 (verl: to r = 5), then shifted like the rest
    assert adv[4] == pytest.approx(-mu / math.sqrt(var + 1e-8), rel=1e-5)


def _verl_token_reference(rewards, groups, masks, baseline: bool) -> np.ndarray:
    """verl's REINFORCE++ (gamma = 1) / REINFORCE++-baseline on token tensors, float64:
    the outcome reward at the last sampled position, returns by the backward recursion
    that carries the running return through masked (observation) positions, or group
    mean subtracted and tiled; then masked_whiten over the mask. Returns [B, L]."""
    m = np.asarray(masks, np.float64)
    B, L = m.shape
    r = np.asarray(rewards, np.float64)
    if baseline:
        scores = r.copy()
        for gid in set(groups):
            sel = np.array([g == gid for g in groups])
            if sel.sum() > 1:
                scores[sel] = r[sel] - r[sel].mean()
        values = scores[:, None] * m
    else:
        tlr = np.zeros((B, L))
        # the reward sits on the last sampled token (verl: the last response token; were
        # that an observation token its recursion would drop the reward, see the docs)
        last = L - 1 - np.argmax(m[:, ::-1] > 0, axis=1)
        tlr[np.arange(B), last] = r
        values = np.zeros((B, L))
        run = np.zeros(B)
        for t in reversed(range(L)):
            new = tlr[:, t] + 1.0 * run
            values[:, t] = new * m[:, t]
            run = new * m[:, t] + run * (1 - m[:, t])
    n = m.sum()
    mean = (values * m).sum() / n
    var = (((values - mean) ** 2) * m).sum() / n * n / (n - 1)
    return (values - mean) / np.sqrt(var + 1e-8) * m


@pytest.mark.parametrize("name", RFPP)
def test_reinforce_pp_equals_verl_token_formula_property(name):
    """Random batches with observation holes and trailing masked tokens: every sampled
    token's verl advantage equals our per-sequence value (groups of >= 2 samples)."""
    rng = np.random.default_rng(7)
    fn = jax.jit(get_advantage_fn(name), static_argnums=2)
    for trial in range(40):
        n_groups = int(rng.integers(2, 6))
        sizes = rng.integers(2, 5, n_groups)
        groups = np.repeat(np.arange(n_groups), sizes)
        B, L = len(groups), 12
        masks = (rng.random((B, L)) < 0.7).astype(np.float64)
        masks[:, 0] = 1.0  # at least one sampled token per row
        if rng.random() < 0.5:
            rewards = rng.integers(0, 2, B).astype(np.float32)
        else:
            rewards = (rng.normal(size=B) * 10.0 ** rng.integers(-2, 3)).astype(np.float32)
        want = _verl_token_reference(rewards, list(groups), masks, name.endswith("baseline"))
        got = np.asarray(
            fn(
                jnp.asarray(rewards),
                jnp.asarray(groups, jnp.int32),
                n_groups,
                jnp.asarray(masks.sum(-1), jnp.float32),
            )
        )
        scale = max(np.abs(want).max(), 1e-3)
        np.testing.assert_allclose(
            (got[:, None] * masks), want, rtol=1e-4, atol=1e-5 * scale, err_msg=str(trial)
        )


def test_reinforce_pp_all_equal_batch_and_degenerate_counts_are_zero():
    for value in (123.456, -0.7, 1e-30, 7.0):
        adv = compute_advantages("reinforce_plus_plus", [value] * 9, list(range(9)), [3] * 9)
        assert np.all(adv == 0.0), (value, adv)
    # fewer than 2 tokens in the batch: no variance -> 0 (verl raises)
    adv = compute_advantages("reinforce_plus_plus", [1.0, 0.0], ["a", "b"], [1, 0])
    np.testing.assert_array_equal(adv, [0.0, 0.0])
    # a zero-length response weighs nothing in the statistics
    with_empty = compute_advantages("reinforce_plus_plus", [1.0, 0.0, 9.0], list("abc"), [2, 2, 0])
    without = compute_advantages("reinforce_plus_plus", [1.0, 0.0], list("ab"), [2, 2])
    np.testing.assert_allclose(with_empty[:2], without, rtol=1e-6)
    # [2, 4] once each: mean 3, unbiased var (1 + 1) / 1 = 2
    whitened = token_whiten(jnp.array([2.0, 4.0]), jnp.array([1.0, 1.0]))
    np.testing.assert_allclose(whitened, np.array([-1, 1]) / math.sqrt(2 + 1e-8), rtol=1e-6)


def test_reinforce_pp_needs_token_counts_and_group_estimators():
    for name in RFPP:
        with pytest.raises(ValueError, match="token_counts"):
            compute_advantages(name, [1.0, 0.0], ["a", "a"])
    with pytest.raises(ValueError, match="token_counts"):
        compute_advantages("reinforce_plus_plus", [1.0, 0.0], ["a", "a"], [1, 2, 3])
    with pytest.raises(ValueError, match="token_counts"):
        compute_advantages("reinforce_plus_plus", [1.0, 0.0], ["a", "a"], [1, -2])
    # the group estimators ignore the counts
    np.testing.assert_array_equal(
        compute_advantages("grpo", [1.0, 0.0], ["a", "a"], [5, 1]),
        compute_advantages("grpo", [1.0, 0.0], ["a", "a"]),
    )
    assert "reinforce_plus_plus_baseline" in GROUP_ESTIMATORS
    assert "reinforce_plus_plus" not in GROUP_ESTIMATORS


# ------------------------------------------------------------------ CISPO
def _case():
    A = jnp.array([[1.0, -1.0, -1.0, 1.0]])
    lr = jnp.array([[0.5, math.log(5.0), math.log(0.5), 0.0]])  # ratios e^.5, 5, .5, 1
    logp = jnp.array([[-1.0, -2.0, -3.0, -0.5]])
    return A, logp, logp - lr


def test_cispo_hand_values_gradient_and_no_dual_clip():
    A, logp, old = _case()
    mask = jnp.ones_like(logp)
    fn = get_policy_loss("cispo")
    cfg = PolicyLossConfig(0.2, 0.28, 3.0)  # the dual clip is not CISPO's: ignored
    loss, m = fn(logp, old, A, mask, cfg)
    # weights clip(r, .8, 1.28) = [1.28, 1.28, .8, 1]; l = -w A logp
    w = [1.28, 1.28, 0.8, 1.0]
    tok = [-w[i] * float(A[0, i]) * float(logp[0, i]) for i in range(4)]
    assert tok == pytest.approx([1.28, -2.56, -2.4, 0.5])
    assert float(loss) == pytest.approx(sum(tok) / 4, rel=1e-5)
    assert float(m["pg_clipfrac"]) == pytest.approx(3 / 4)
    assert float(m["pg_clipfrac_lower"]) == 0.0
    assert float(m["ratio_max"]) == pytest.approx(5.0, rel=1e-5)
    # gradient -w A / 4 on every token, clipped ones included (PPO's would be 0 there)
    g = jax.grad(lambda lp: fn(lp, old, A, mask, cfg)[0])(logp)
    np.testing.assert_allclose(g, [[-1.28 / 4, 1.28 / 4, 0.8 / 4, -1 / 4]], rtol=1e-5)
    g_ppo = jax.grad(lambda lp: get_policy_loss("ppo")(lp, old, A, mask, cfg)[0])(logp)
    np.testing.assert_allclose(g_ppo, [[0, 0, 0, -0.25]], atol=1e-6)


def test_cispo_no_lower_bound_mask_and_is_weights():
    A, logp, old = _case()
    fn = get_policy_loss("cispo")
    cfg = PolicyLossConfig(10.0, 0.2, None)  # verl's CISPO recipe: clip_ratio_low=10
    loss, m = fn(logp, old, A, jnp.ones_like(logp), cfg)
    # weights [1.2, 1.2, .5 (not clipped below), 1]
    tok = [1.2, -2.4, -1.5, 0.5]  # -w A logp
    assert float(loss) == pytest.approx(sum(tok) / 4, rel=1e-5)
    assert float(m["pg_clipfrac"]) == pytest.approx(2 / 4)
    mask = jnp.array([[1.0, 0.0, 1.0, 1.0]])
    isw = jnp.array([[2.0, 7.0, 0.5, 1.0]])
    loss_w, m_w = fn(logp, old, A, mask, cfg, is_weights=isw)
    assert float(loss_w) == pytest.approx((1.2 * 2 - 1.5 * 0.5 + 0.5) / 3, rel=1e-5)
    assert float(m_w["tis_weight_mean"]) == pytest.approx(3.5 / 3)
    # per-token advantages [B,T] are taken as given
    loss_t, _ = fn(logp, old, jnp.broadcast_to(A, logp.shape), mask, cfg)
    assert float(loss_t) == pytest.approx((1.2 - 1.5 + 0.5) / 3, rel=1e-5)


def test_clip_ratio_low_validation():
    PolicyLossConfig(clip_ratio_low=10.0)  # >= 1: no lower bound
    with pytest.raises(ValueError, match="clip_ratio_low"):
        PolicyLossConfig(clip_ratio_low=-0.1)


# ------------------------------------------------------------------ per-turn credit
def test_turn_index_and_weights_hand_values():
    # prompt (0), turn 1 (1,2), observation (3,4), turn 2 (5,6), obs (7), turn 3 (8), end (9)
    mask = jnp.array([[0, 1, 1, 0, 0, 1, 1, 0, 1, 0], [0] * 10, [1] * 10], jnp.float32)
    turn, k = turn_index(mask)
    assert turn[0].tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 3, 3]
    assert k.tolist() == [3, 0, 1]
    w = turn_discount_weights(mask, 0.5)
    np.testing.assert_allclose(
        w[0], [0.125, 0.25, 0.25, 0.25, 0.25, 0.5, 0.5, 0.5, 1.0, 1.0], rtol=1e-7
    )
    np.testing.assert_array_equal(w[1], 1.0)  # no sampled token
    np.testing.assert_array_equal(w[2], 1.0)  # one turn: the whole advantage
    np.testing.assert_array_equal(turn_discount_weights(mask, 1.0), 1.0)
    for bad in (0.0, 1.5, -0.5):
        with pytest.raises(ValueError, match="turn_discount"):
            turn_discount_weights(mask, bad)
    with pytest.raises(ValueError, match="advantages must be"):
        turn_discounted_advantages(jnp.ones(2), mask, 0.5)


def _multi_turn_trajectories():
    """A scripted two-prompt batch: 3 turns, 2 turns, 1 turn (2 samples of prompt p)."""
    from verltool_jax.rollout.trajectory import Trajectory

    def traj(tid, gid, prompt, segments, reward):
        ids, mask = [], []
        for n_tokens, sampled in segments:
            ids += list(range(10, 10 + n_tokens))
            mask += [int(sampled)] * n_tokens
        return Trajectory(
            trajectory_id=tid,
            group_id=gid,
            prompt_ids=prompt,
            response_ids=ids,
            loss_mask=mask,
            logprobs=[-0.5 if m else 0.0 for m in mask],
            versions=[0 if m else -1 for m in mask],
            reward=reward,
        )

    return [
        # turn (2) obs (2) turn (1) obs (1) turn (2)
        traj("a", "p", [1, 2], [(2, 1), (2, 0), (1, 1), (1, 0), (2, 1)], 1.0),
        # turn (3) obs (2) turn (1)
        traj("b", "p", [1, 2, 3], [(3, 1), (2, 0), (1, 1)], 0.0),
        # one turn, another prompt
        traj("c", "q", [4], [(4, 1)], 1.0),
        traj("d", "q", [4], [(3, 1)], 0.0),
    ]


def test_turn_credit_on_a_scripted_multi_turn_batch():
    from verltool_jax.train.batch import batch_from_trajectories

    trajs = _multi_turn_trajectories()
    adv = compute_advantages("drgrpo", [t.reward for t in trajs], [t.group_id for t in trajs])
    np.testing.assert_allclose(adv, [0.5, -0.5, 0.5, -0.5])
    b = batch_from_trajectories(trajs, adv, pad_id=0, max_len=16, pad_to_multiple=16)
    tok = np.asarray(turn_discounted_advantages(jnp.asarray(adv), jnp.asarray(b["loss_mask"]), 0.9))
    lm = b["loss_mask"]
    # row a: prompt 2 -> response token j is the target of position 1 + j
    want_a = np.zeros(16)
    want_a[1:3] = 0.5 * 0.81  # turn 1 of 3
    want_a[5:6] = 0.5 * 0.9  # turn 2
    want_a[7:9] = 0.5  # turn 3: the full advantage
    np.testing.assert_allclose(tok[0] * lm[0], want_a, rtol=1e-6)
    # row b: prompt 3, turn 1 (3 tokens) at 2..4, obs 5..6, turn 2 at 7
    want_b = np.zeros(16)
    want_b[2:5] = -0.5 * 0.9
    want_b[7] = -0.5
    np.testing.assert_allclose(tok[1] * lm[1], want_b, rtol=1e-6)
    # one-turn rows: unchanged
    np.testing.assert_allclose(tok[2] * lm[2], 0.5 * lm[2])
    np.testing.assert_allclose(tok[3] * lm[3], -0.5 * lm[3])


def test_train_on_applies_reinforce_pp_counts_and_turn_discount():
    """make_batch: REINFORCE++ whitens with the sampled-token counts, and
    algo.turn_discount hands the step per-token advantages [B,T]."""
    import dataclasses
    from pathlib import Path

    from verltool_jax.cli.command_line import parse_command_line
    from verltool_jax.cli.validate import validate_config
    from verltool_jax.train.batch import make_batch

    tiny = str(Path(__file__).resolve().parents[2] / "configs" / "tiny_math.py")
    seen = []

    def step(rc, trajs):
        b = make_batch(rc, rc.algo_for_run(), trajs, pad_id=0)
        assert b is not None
        seen.append({k: np.array(v) for k, v in b.arrays.items()})

    rc = validate_config(parse_command_line(["--config", tiny]).config)
    algo = dataclasses.replace(rc.algo, mini_batch_size=None, adv_estimator="reinforce_plus_plus")
    rc = dataclasses.replace(rc, algo=algo)
    trajs = _multi_turn_trajectories()
    step(rc, trajs)
    counts = [5, 4, 4, 3]  # sampled tokens per trajectory
    want = compute_advantages("reinforce_plus_plus", [1.0, 0.0, 1.0, 0.0], list("abcd"), counts)
    np.testing.assert_allclose(seen[-1]["advantages"], want, rtol=1e-6)
    assert seen[-1]["advantages"].shape == (4,)
    rc2 = dataclasses.replace(rc, algo=dataclasses.replace(algo, turn_discount=0.5))
    step(rc2, trajs)
    per_tok = seen[-1]["advantages"]
    lm = seen[-1]["loss_mask"]
    assert per_tok.shape == lm.shape
    row_a = per_tok[0][lm[0] > 0]
    np.testing.assert_allclose(row_a, want[0] * np.array([0.25, 0.25, 0.5, 1.0, 1.0]), rtol=1e-6)
    np.testing.assert_allclose(per_tok[2][lm[2] > 0], want[2], rtol=1e-6)


def test_algo_config_selects_the_new_estimators_loss_and_turn_discount():
    from verltool_jax.algos.config import algo_choices, algo_config

    cfg = algo_config(
        adv_estimator="reinforce_plus_plus_baseline",
        policy_loss="cispo",
        clip_ratio_low=10.0,
        turn_discount=0.9,
    )
    assert cfg.policy_loss_config().clip_ratio_low == 10.0
    ch = algo_choices()
    assert {"reinforce_plus_plus", "reinforce_plus_plus_baseline"} <= set(ch["adv_estimator"])
    assert "cispo" in ch["policy_loss"]
    with pytest.raises(ValueError, match="turn_discount"):
        algo_config(turn_discount=0.0)
    with pytest.raises(ValueError, match="algo.adv_estimator"):
        algo_config(adv_estimator="reinforce")


def test_one_sample_per_prompt_only_for_the_groupless_estimator():
    """rollout.n_samples=1 leaves every group estimator at 0 advantage: the config says
    so; REINFORCE++ has a batch baseline and accepts it."""
    from pathlib import Path

    from verltool_jax.cli.command_line import parse_command_line
    from verltool_jax.run_config import ConfigError

    tiny = str(Path(__file__).resolve().parents[2] / "configs" / "tiny_math.py")
    one = "--config.rollout.n_samples=1"
    parse_command_line(["--config", tiny, one, "--config.algo.adv_estimator=reinforce_plus_plus"])
    for est in ("reinforce_plus_plus_baseline", "drgrpo"):
        with pytest.raises(ConfigError, match="n_samples=1 must be >= 2"):
            parse_command_line(["--config", tiny, one, f"--config.algo.adv_estimator={est}"])


def test_cispo_train_step_with_per_token_advantages_micro_equals_whole():
    """The jitted train step on the tiny model with CISPO and per-turn [B,T] advantages:
    two micro-batches give the update of the whole batch, which moves the params although
    the sampler's logprobs put many weights at the clip bound."""
    from support.train import SGD, batch, host, new_model

    from verltool_jax.train.state import TrainState
    from verltool_jax.train.step import make_train_step

    b = batch(3)
    b["advantages"] = np.asarray(
        turn_discounted_advantages(jnp.asarray(b["advantages"]), jnp.asarray(b["loss_mask"]), 0.5)
    )
    assert b["advantages"].ndim == 2
    out = {}
    for micro in (None, 4):
        cfg = dict(
            policy_loss="cispo",
            clip_ratio_low=10.0,
            clip_ratio_high=0.2,
            dual_clip_c=None,
            tis_cap=None,
            mini_batch_size=None,
            micro_batch_size=micro,
        )
        state = TrainState.create(new_model(0), SGD, seed=0)
        p0 = host(state.params)
        new, m = make_train_step(cfg, state.graphdef, SGD)(state, dict(b))
        out[micro] = (p0, host(new.params), host(m))
    p0, pw, mw = out[None]
    _, pm, mm = out[4]
    moved = max(
        float(np.abs(a - c).max()) for a, c in zip(jax.tree.leaves(pw), jax.tree.leaves(p0))
    )
    assert moved > 1e-4
    assert 0 < float(mw["pg_clipfrac"]) < 1
    for a, c in zip(jax.tree.leaves(pw), jax.tree.leaves(pm)):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)
    assert float(mm["loss"]) == pytest.approx(float(mw["loss"]), rel=1e-4)


def test_turn_credit_on_a_scripted_multi_turn_rollout(tok, tool_url):
    """The agent loop with a real tool server and a scripted sampler: sample 0 makes two
    python calls and answers (3 turns, reward 1), sample 1 answers at once (reward 0).
    With Dr.GRPO (A = +-0.5) and turn_discount 0.5 the step sees 0.125 on the first
    turn's tokens, 0.25 on the second's, 0.5 on the answer's, and -0.5 on sample 1's."""
    import dataclasses
    from pathlib import Path

    from support.scripted_sampler import ScriptedSampler

    from tool_server.client import ToolClient
    from verltool_jax.cli.command_line import parse_command_line
    from verltool_jax.cli.validate import validate_config
    from verltool_jax.rollout.agent_loop import PromptItem, run_rollout
    from verltool_jax.rollout.config import RolloutConfig
    from verltool_jax.train.batch import make_batch

    turns = {
        "p0-0": ["<python>print(6)</python>", "<python>print(7)</python>", "<answer>42</answer>"],
        "p0-1": ["<answer>41</answer>"],
    }
    sampler = ScriptedSampler(tok, lambda rid, k: turns[rid][k])
    prompt = tok.encode("<|im_start|>user\n6 * 7?<|im_end|>\n<|im_start|>assistant\n")

    async def go():
        async with ToolClient(tool_url) as c:
            cfg = RolloutConfig(max_turns=4, max_response_tokens=256)
            return await run_rollout([PromptItem(prompt, group_id="p0")], 2, sampler, c, tok, cfg)

    ((a, b),) = asyncio.run(go())
    assert (a.num_turns, a.tool_calls, b.num_turns) == (3, 2, 1)
    a.reward, b.reward = 1.0, 0.0
    lens = [len(sampler.encode_turn(s)) for s in turns["p0-0"]]
    lens[-1] += 1  # the EOS the sampler appends to the answer
    assert sum(a.loss_mask) == sum(lens)

    tiny = str(Path(__file__).resolve().parents[2] / "configs" / "tiny_math.py")
    rc = validate_config(parse_command_line(["--config", tiny]).config)
    algo = dataclasses.replace(
        rc.algo, mini_batch_size=None, adv_estimator="drgrpo", turn_discount=0.5
    )
    rc = dataclasses.replace(rc, algo=algo, model=dataclasses.replace(rc.model, max_seq_len=512))
    batch = make_batch(rc, rc.algo_for_run(), [a, b], 0)
    assert batch is not None
    adv, lm = batch.arrays["advantages"], batch.arrays["loss_mask"]
    want_a = [0.5 * 0.25] * lens[0] + [0.5 * 0.5] * lens[1] + [0.5] * lens[2]
    np.testing.assert_allclose(adv[0][lm[0] > 0], want_a, rtol=1e-6)
    np.testing.assert_allclose(adv[1][lm[1] > 0], -0.5, rtol=1e-6)
