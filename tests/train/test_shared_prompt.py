"""Shared-prompt training: a GRPO group's prompt runs once and its responses attend to its
keys and values. Per-token logprobs, losses, gradients and updates equal the plain
layout's (ragged prompts and responses, observation spans, LoRA, remat + scan, a mesh),
and the layout is chosen only where it applies and pays."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from support.train import MODEL_CFG, VOCAB, host

from verltool_jax.algos.config import algo_config
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.models.lora import with_lora
from verltool_jax.models.transformer import Transformer
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.run_config import RunConfig, run_config_from_dict
from verltool_jax.schema import ConfigError
from verltool_jax.train.batch import (
    batch_from_trajectories,
    check_batch,
    make_batch,
    prompt_group_size,
    shift_targets,
)
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step

N = 4  # rows per group


def groups(seed: int, n_groups: int = 4, n: int = N, prompt=(3, 12), resp=(1, 9)):
    """``n_groups`` groups of ``n`` trajectories: one prompt per group (ragged across
    groups), ragged responses, an observation span (loss mask 0) in the longer ones."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(n_groups):
        p = rng.integers(1, VOCAB, int(rng.integers(*prompt))).tolist()
        for j in range(n):
            r = int(rng.integers(*resp))
            mask = [1] * r
            if r >= 5:
                mask[2:4] = [0, 0]
            out.append(
                Trajectory(
                    trajectory_id=f"t{g}-{j}",
                    group_id=f"g{g}",
                    prompt_ids=p,
                    response_ids=rng.integers(1, VOCAB, r).tolist(),
                    loss_mask=mask,
                    logprobs=[float(-rng.uniform(0.5, 4.0)) if m else 0.0 for m in mask],
                    versions=[0] * r,
                    reward=float(rng.integers(0, 2)),
                )
            )
    return out


def both_layouts(trajs, n=N):
    adv = np.linspace(-1.0, 1.0, len(trajs)).astype(np.float32)
    plain = batch_from_trajectories(trajs, adv, pad_id=0, max_len=64)
    shared = batch_from_trajectories(trajs, adv, pad_id=0, max_len=64, group_size=n)
    return plain, shared


def response_view(plain: dict, shared: dict, key: str, trajs) -> tuple[np.ndarray, np.ndarray]:
    """``key`` at every response target of both layouts, row by row."""
    a, b = [], []
    for i, tr in enumerate(trajs):
        p, r = len(tr.prompt_ids), len(tr.response_ids)
        a.append(np.asarray(plain[key])[i, p - 1 : p - 1 + r])
        b.append(np.asarray(shared[key])[i, :r])
    return np.concatenate(a), np.concatenate(b)


def test_layout_and_group_detection():
    trajs = groups(0)
    plain, shared = both_layouts(trajs)
    G = len(trajs) // N
    B, T = check_batch(shared)
    assert shared["prefix_ids"].shape[0] == G and B == len(trajs)
    assert T < plain["input_ids"].shape[1]
    for g in range(G):
        head = trajs[g * N].prompt_ids
        assert shared["prefix_ids"][g, : len(head) - 1].tolist() == head[:-1]
        assert shared["prefix_mask"][g].sum() == len(head) - 1
    for i, tr in enumerate(trajs):  # each row: the last prompt token, then the response
        assert shared["input_ids"][i, 0] == tr.prompt_ids[-1]
    for key in ("loss_mask", "sampler_logprobs", "old_logprobs"):
        a, b = response_view(plain, shared, key, trajs)
        np.testing.assert_array_equal(a, b)
        assert np.asarray(plain[key]).sum() == pytest.approx(np.asarray(shared[key]).sum())
    assert prompt_group_size(trajs) == N
    other = dataclasses.replace(trajs[5], prompt_ids=[9] + trajs[5].prompt_ids[1:])
    assert prompt_group_size(trajs[:5] + [other] + trajs[6:]) == 0  # a member differs
    assert prompt_group_size(trajs[:-1]) == 0  # a ragged group
    with pytest.raises(ValueError, match="not groups of 4"):
        batch_from_trajectories(trajs[:-1], np.zeros(len(trajs) - 1), 0, 64, group_size=N)
    bad = dict(shared, prefix_ids=shared["prefix_ids"][:3], prefix_mask=shared["prefix_mask"][:3])
    with pytest.raises(ValueError, match="prefix_ids"):
        check_batch(bad)


def _model(remat: str = "none", lora: bool = False, seed: int = 0):
    cfg = MODEL_CFG.replace(remat_policy=remat, attention_causal_block=4)
    m = Transformer(cfg, nnx.Rngs(seed))
    if lora:
        m = with_lora(m, rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
        for path, v in nnx.to_flat_state(nnx.state(m, nnx.LoRAParam)):
            if path[-1] == "lora_b":  # non-zero B: the adapters change the function
                v.set_value(jax.random.normal(jax.random.PRNGKey(len(path)), v.shape) * 0.05)
    return m


@pytest.mark.parametrize("remat", ["none", "full"])
def test_logprobs_equal_the_plain_layout(remat):
    """Every response token's logprob (and entropy) equals the whole sequence's, with
    right- and left-padded prefixes; ``full`` remat scans the layers."""
    trajs = groups(1)
    plain, shared = both_layouts(trajs)
    graphdef, params = nnx.split(_model(remat))

    @jax.jit
    def score(ids, mask, prefix=None):
        model = nnx.merge(graphdef, params)
        return token_logprobs(
            model, ids, mask, shift_targets(ids), return_entropy=True, prefix=prefix
        )

    want, want_h = score(plain["input_ids"], plain["attention_mask"])
    pre = (shared["prefix_ids"], shared["prefix_mask"])
    left = tuple(np.stack([np.roll(x, -int(m.sum())) for x, m in zip(a, pre[1])]) for a in pre)
    for prefix in (pre, left):
        got, got_h = score(shared["input_ids"], shared["attention_mask"], prefix)
        plain_view = dict(plain, lp=np.asarray(want), h=np.asarray(want_h))
        shared_view = dict(shared, lp=np.asarray(got), h=np.asarray(got_h))
        for key in ("lp", "h"):
            a, b = response_view(plain_view, shared_view, key, trajs)
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=2e-5)


STEP_CONFIGS = {
    # the whole batch at once; GSPO (sequence ratios) + truncated IS
    "whole": dict(
        policy_loss="gspo",
        loss_agg_mode="seq-mean-token-mean",
        tis_cap=2.0,
        mini_batch_size=None,
        micro_batch_size=None,
    ),
    # micro-batches of 2 groups, recomputed old logprobs, KL to the reference, entropy
    "micro_recompute_kl": dict(
        policy_loss="ppo",
        loss_agg_mode="token-mean",
        old_logprobs="recompute",
        kl_coef=0.1,
        kl_estimator="k3",
        entropy_coef=0.01,
        mini_batch_size=None,
        micro_batch_size=2 * N,
    ),
}


def _step(name: str, model, mesh=None):
    cfg = algo_config(STEP_CONFIGS[name])
    state = TrainState.create(model, optax.sgd(0.5), with_reference=cfg.kl_coef > 0)
    return state, make_train_step(cfg, state.graphdef, optax.sgd(0.5), mesh=mesh, donate=False)


def _assert_same_update(a, b):
    (pa, ma), (pb, mb) = a, b
    for k in ("loss", "pg_loss", "grad_norm", "ratio_mean", "kl_loss", "entropy"):
        if k in ma:
            assert float(mb[k]) == pytest.approx(float(ma[k]), rel=2e-5, abs=1e-6), k
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize(
    "name,lora", [("whole", False), ("micro_recompute_kl", False), ("whole", True)]
)
def test_train_step_equals_the_plain_layout(name, lora):
    """Loss, metrics and the SGD update (so the gradient) of one step are the plain
    layout's; with LoRA only the adapters move, identically."""
    trajs = groups(2)
    plain, shared = both_layouts(trajs)
    results = []
    for bt in (plain, shared):
        state, step = _step(name, _model(lora=lora))
        p0 = host(state.params)
        new, m = step(state, bt)
        results.append((host(new.params), host(m)))
    moved = max(
        float(np.abs(a - b).max())
        for a, b in zip(jax.tree.leaves(results[0][0]), jax.tree.leaves(p0))
    )
    assert moved > 1e-4  # the update did something
    _assert_same_update(*results)


def test_sharded_shared_step_equals_the_plain_step():
    from support.sharding import shard_state

    from verltool_jax.sharding import make_mesh

    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (scripts/test.sh)")
    mesh = make_mesh((2, 2, 2))
    trajs = groups(3, n_groups=4, n=2)  # G = 4 prefixes on 4 batch shards, 8 rows
    plain, shared = both_layouts(trajs, n=2)
    state, step = _step("whole", _model())
    want = step(state, plain)
    state, step = _step("whole", _model(), mesh)
    params = shard_state(state.params, mesh)
    state = state.replace(params=params, opt_state=optax.sgd(0.5).init(params))
    got = step(state, shared)
    _assert_same_update((host(want[0].params), host(want[1])), (host(got[0].params), host(got[1])))


@pytest.mark.slow
def test_sharded_step_replicates_prefixes_the_mesh_does_not_divide():
    from support.sharding import shard_state

    from verltool_jax.sharding import make_mesh

    mesh = make_mesh((2, 2, 2))
    trajs = groups(3, n_groups=3, n=4)  # 3 prefixes (12 rows) on 4 batch shards
    plain, shared = both_layouts(trajs)
    state, step = _step("whole", _model())
    want = step(state, plain)
    state, step = _step("whole", _model(), mesh)
    got = step(state.replace(params=shard_state(state.params, mesh)), shared)
    assert float(got[1]["loss"]) == pytest.approx(float(want[1]["loss"]), rel=2e-5)


def _rc(**trainer) -> RunConfig:
    from configs import base

    c = base.get_config()
    c.rollout.n_samples = N
    c.algo.mini_batch_size = 2 * N
    c.algo.micro_batch_size = N
    for k, v in trainer.items():
        c.trainer[k] = v
    return run_config_from_dict(c)


def test_make_batch_picks_the_layout_where_it_pays():
    rc = _rc()
    assert rc.trainer.shared_prompt == "auto"
    algo = rc.algo_for_run()
    long_prompts = groups(4, prompt=(40, 60), resp=(1, 9))
    short_prompts = groups(4, prompt=(2, 4), resp=(30, 40))
    for trajs, mode, want in (
        (long_prompts, "auto", True),
        (short_prompts, "auto", False),  # too little to share
        (short_prompts, "on", True),
        (long_prompts, "off", False),
        (long_prompts[:-1], "on", False),  # a failed member: a ragged group
    ):
        rcm = dataclasses.replace(rc, trainer=dataclasses.replace(rc.trainer, shared_prompt=mode))
        bt = make_batch(rcm, algo, trajs, pad_id=0)
        assert bt is not None
        assert ("prefix_ids" in bt.arrays) == want, (mode, len(trajs))
        assert bt.metrics["batch/shared_prompt"] == float(want)


def test_on_is_refused_where_it_cannot_apply():
    with pytest.raises(ConfigError, match="trainer.shared_prompt"):
        _rc(shared_prompt="maybe")
    from configs import base

    c = base.get_config()
    c.rollout.n_samples = 4
    c.algo.micro_batch_size = 6
    c.algo.mini_batch_size = 12
    c.trainer.shared_prompt = "on"
    with pytest.raises(ConfigError, match="micro_batch_size=6 is not a multiple of the group"):
        run_config_from_dict(c)
    c.trainer.shared_prompt = "auto"  # falls back instead
    assert run_config_from_dict(c).trainer.shared_prompt == "auto"


def test_shared_batch_needs_whole_groups_per_micro_batch():
    _, shared = both_layouts(groups(5))
    cfg = dict(STEP_CONFIGS["whole"], micro_batch_size=2)
    state = TrainState.create(_model(), optax.sgd(0.5))
    step = make_train_step(cfg, state.graphdef, optax.sgd(0.5), donate=False)
    with pytest.raises(ValueError, match="whole prompt groups of 4; make algo.micro_batch_size"):
        step(state, shared)


@pytest.mark.slow  # token_parity runs eagerly: ~100 s of op-by-op compilation
def test_sampler_parity_scores_shared_groups_like_plain_rows():
    """The parity metric scores a group's prompt once: the trainer's own logprobs given
    as the sampler's differ by ~0 in both layouts, over the same tokens."""
    from verltool_jax.train.metrics import sampler_parity

    trajs = groups(6, n_groups=2, n=2)
    plain, _ = both_layouts(trajs, n=2)
    model = _model()
    lp = np.asarray(
        token_logprobs(
            model, plain["input_ids"], plain["attention_mask"], shift_targets(plain["input_ids"])
        )
    )
    trajs = [
        dataclasses.replace(
            t,
            logprobs=[
                float(lp[i, len(t.prompt_ids) - 1 + j]) if m else 0.0
                for j, m in enumerate(t.loss_mask)
            ],
        )
        for i, t in enumerate(trajs)
    ]
    got = {mode: sampler_parity(model, trajs, 0, 1.0, 0, 64, mode) for mode in ("on", "off")}
    assert got["on"]["sync/parity_tokens"] == got["off"]["sync/parity_tokens"] > 0
    for mode in ("on", "off"):
        assert got[mode]["sync/logprob_diff_max"] < 2e-5, mode
