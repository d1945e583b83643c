"""PPO with a critic (algo.adv_estimator="gae") in the real train step on a tiny model:
the critic learns, the policy trains on GAE advantages, make_batch carries the rewards,
and a checkpoint restores the critic exactly."""

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest
from support.train import gae_batch, host, new_state, step_for, trajectories

from verltool_jax.algos.config import algo_config
from verltool_jax.models.value import ValueModel, value_model_from_policy
from verltool_jax.train.checkpoint import Checkpointer
from verltool_jax.train.step import make_train_step


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(host(tree))]


def test_gae_steps_train_policy_and_critic(tmp_path):
    step, _ = step_for("gae")
    state = new_state("gae")
    policy0, critic0 = _leaves(state.params), _leaves(state.value_params)
    batch = gae_batch(3)
    losses = []
    for _ in range(3):  # the same batch: the value loss must fall
        state, m = step(state, batch)
        losses.append(float(m["vf_loss"]))
        for k in ("vf_loss", "vf_clipfrac", "vf_explained_var", "vf_grad_norm", "pg_loss"):
            assert np.isfinite(float(m[k])), k
        assert float(m["skipped_updates"]) == 0 and float(m["vf_skipped_updates"]) == 0
    assert losses[-1] < 0.5 * losses[0], losses
    # the first step starts from a zero value head: values 0, explained variance 0
    assert any(not np.array_equal(a, b) for a, b in zip(policy0, _leaves(state.params)))
    assert any(not np.array_equal(a, b) for a, b in zip(critic0, _leaves(state.value_params)))

    # resume: the restored critic (params and optimizer state) is the saved one, and the
    # next step from it is the uninterrupted run's
    with Checkpointer(tmp_path / "ck", save_every=1, keep=1) as ck:
        ck.maybe_save(state, {"next": 3}, force=True)
    saved_critic, saved_vopt = _leaves(state.value_params), _leaves(state.value_opt_state)
    state, m_full = step(state, gae_batch(4))
    with Checkpointer(tmp_path / "ck", save_every=1, keep=1) as ck:
        restored, data = ck.restore(new_state("gae", seed=5))
    assert data == {"next": 3} and int(restored.step) == 3
    for a, b in zip(saved_critic, _leaves(restored.value_params)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(saved_vopt, _leaves(restored.value_opt_state)):
        np.testing.assert_array_equal(a, b)
    restored, m_resumed = step(restored, gae_batch(4))
    np.testing.assert_allclose(float(m_resumed["vf_loss"]), float(m_full["vf_loss"]), rtol=1e-6)
    for a, b in zip(_leaves(state.value_params), _leaves(restored.value_params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_value_model_copies_the_policy_and_starts_at_zero():
    state = new_state("gae")
    policy = state.model()
    critic = value_model_from_policy(policy)
    assert isinstance(critic, ValueModel)
    b = gae_batch(1)
    v = np.asarray(critic(b["input_ids"], b["attention_mask"]))
    assert v.shape == b["input_ids"].shape and np.all(v == 0)
    # a copy: changing the critic's backbone leaves the policy alone
    emb = critic.backbone.embed.embedding
    emb[...] = emb[...] + 1.0
    assert not np.allclose(np.asarray(policy.embed.embedding[...]), np.asarray(emb[...]))


def test_gae_needs_a_critic_and_rewards():
    state = new_state("gae")
    with pytest.raises(ValueError, match="value_optimizer"):
        make_train_step(algo_config(adv_estimator="gae"), state.graphdef, None)
    step, _ = step_for("gae")
    no_rewards = gae_batch(2)
    del no_rewards["rewards"]
    with pytest.raises(ValueError, match="rewards"):
        step(state, no_rewards)
    with pytest.raises(ValueError, match="with_critic"):
        step(state.replace(value_params=None, value_opt_state=None), gae_batch(2))


def test_make_batch_carries_rewards_for_gae():
    from verltool_jax.cli.command_line import parse_command_line
    from verltool_jax.cli.validate import validate_config
    from verltool_jax.train.batch import make_batch

    tiny = str(Path(__file__).resolve().parents[2] / "configs" / "tiny_math.py")
    rc = validate_config(parse_command_line(["--config", tiny]).config)
    algo = dataclasses.replace(rc.algo, mini_batch_size=8, adv_estimator="gae")
    trajs = trajectories(0, n=6)
    batch = make_batch(dataclasses.replace(rc, algo=algo), algo, trajs, pad_id=0)
    assert batch is not None
    arr = batch.arrays
    want = [t.reward for t in trajs] + [0.0] * 2  # padding rows: no reward, no tokens
    np.testing.assert_array_equal(arr["rewards"], want)
    assert not np.any(arr["advantages"]) and not np.any(arr["loss_mask"][6:])
    assert "batch/adv_abs_mean" not in batch.metrics


def test_critic_is_sharded_by_the_policy_rules():
    from jax.sharding import PartitionSpec as P
    from support.sharding import shard_model

    from verltool_jax.sharding import make_mesh, param_spec

    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (scripts/test.sh)")
    mesh = make_mesh((2, 2, 2))
    policy = shard_model(new_state("gae").model(), mesh)
    critic = value_model_from_policy(policy, mesh)
    specs = {}
    for path, x in jax.tree_util.tree_flatten_with_path(nnx_params(critic))[0]:
        name = jax.tree_util.keystr(path)
        specs[name] = x.sharding.spec
        assert x.sharding.spec == param_spec(path, x.shape, mesh), name
    assert any("tp" in str(s) for s in specs.values())  # really split, like the policy
    head = [s for n, s in specs.items() if "value_head" in n and "kernel" in n]
    assert head == [P("fsdp", None)]


@pytest.mark.slow
def test_sharded_gae_step_equals_unsharded():
    from support.sharding import shard_batch, shard_state

    from verltool_jax.sharding import make_mesh

    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (scripts/test.sh)")
    mesh = make_mesh((2, 2, 2))
    plain, _ = step_for("gae")
    want, m_want = plain(new_state("gae"), gae_batch(2))
    sharded, _ = step_for("gae", mesh)
    state = new_state("gae")
    state = state.replace(
        params=shard_state(state.params, mesh), value_params=shard_state(state.value_params, mesh)
    )
    got, m_got = sharded(state, shard_batch(gae_batch(2), mesh))
    for a, b in zip(_leaves(got.value_params), _leaves(want.value_params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)  # Adam: ~1e-6 grads amplified
    for a, b in zip(_leaves(got.params), _leaves(want.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)  # Adam: ~1e-6 grads amplified
    for k in ("vf_loss", "pg_loss", "vf_explained_var"):
        assert float(m_got[k]) == pytest.approx(float(m_want[k]), rel=1e-4, abs=1e-6), k


def nnx_params(module):
    from flax import nnx

    return nnx.state(module, nnx.Param)
