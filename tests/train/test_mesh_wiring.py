"""The config's ``mesh_shape`` reaches the train step: the model loads straight into its
shardings, the step sees its parameters and batch split as configured, a few steps give
the single-device losses, and the sampler weight push gathers the sharded parameters."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from support.models import tiny_ckpt
from support.sharding import shard_batch
from support.train import batch, host

from verltool_jax.algos.optimizer import make_optimizer
from verltool_jax.models.hf_io import load_hf
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.run_config import RunConfig
from verltool_jax.samplers.weight_sync import named_tensors_from_params, pack_named_tensors
from verltool_jax.sharding import BATCH_AXES, param_spec
from verltool_jax.train.build import trainer_mesh
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step

STEPS = 3


class ShardingProbe:
    """``token_logprobs`` that records, from inside the compiled step, how its batch
    (``input_ids``) and the embedding table are actually partitioned."""

    def __init__(self):
        self.seen: dict = {}

    def __call__(self, model, input_ids, *args, **kw):
        def record(name):
            return lambda s: self.seen.setdefault(name, s)

        jax.debug.inspect_array_sharding(input_ids, callback=record("input_ids"))
        jax.debug.inspect_array_sharding(model.embed.embedding[...], callback=record("embed"))
        return token_logprobs(model, input_ids, *args, **kw)


def _run(rc: RunConfig, ckpt):
    mesh = trainer_mesh(rc)
    model = load_hf(ckpt, mesh=mesh)
    algo = rc.algo_for_run()
    optimizer = make_optimizer(rc.optimizer_for_run())
    state = TrainState.create(model, optimizer, seed=0)
    probe = ShardingProbe()
    step = make_train_step(algo, state.graphdef, optimizer, mesh=mesh, logprob_fn=probe)
    params_init = host(state.params)
    loaded = [
        (path, arr.shape, arr.sharding)
        for path, arr in jax.tree_util.tree_flatten_with_path(state.params)[0]
    ]
    losses, grad_norms = [], []
    for i in range(STEPS):
        b = batch(i)
        state, m = step(state, shard_batch(b, mesh) if mesh is not None else b)
        losses.append(float(m["loss"]))
        grad_norms.append(float(m["grad_norm"]))
    return dict(
        mesh=mesh,
        loaded=loaded,
        params_init=params_init,
        state=state,
        probe=probe,
        losses=losses,
        grad_norms=grad_norms,
    )


@pytest.fixture(scope="module")
def runs():
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (scripts/test.sh)")
    ckpt = tiny_ckpt("qwen2")
    base = RunConfig()
    algo = dataclasses.replace(base.algo, mini_batch_size=8, micro_batch_size=4)
    # eps=1e-4: AdamW divides by sqrt(v) + eps, so with the default 1e-8 a 1e-9 gradient
    # whose sign differs between the sharded and the one-device reduction moves its weight
    # by +-lr either way; a larger eps damps near-zero gradients so the two runs compare
    opt = dataclasses.replace(base.optimizer, lr=3e-3, warmup_steps=0, eps=1e-4)
    single = dataclasses.replace(base, algo=algo, optimizer=opt, mesh_shape=(1, 1, 1))
    sharded = dataclasses.replace(single, mesh_shape=(2, 2, 2))
    return ckpt, _run(single, ckpt), _run(sharded, ckpt)


def test_mesh_shape_reaches_the_step_with_the_configured_shardings(runs):
    _, one, sh = runs
    mesh = sh["mesh"]
    assert one["mesh"] is None
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tp": 2}
    # loaded straight into the rule's sharding, kept by the step
    for path, shape, sharding in sh["loaded"]:
        want = NamedSharding(mesh, param_spec(path, shape, mesh))
        assert sharding.is_equivalent_to(want, len(shape)), path
    specs = [a.sharding.spec for a in jax.tree.leaves(sh["state"].params)]
    assert any("tp" in str(s) for s in specs) and any("fsdp" in str(s) for s in specs)
    for path, arr in jax.tree_util.tree_flatten_with_path(sh["state"].params)[0]:
        assert arr.sharding.spec == param_spec(path, arr.shape, mesh), path
    # inside the compiled step: batch rows over (data, fsdp), the embedding per its rule
    seen = sh["probe"].seen
    assert seen["input_ids"].spec[0] == BATCH_AXES
    emb_shape = next(shape for path, shape, _ in sh["loaded"] if "embed" in str(path))
    assert seen["embed"].is_equivalent_to(
        NamedSharding(mesh, param_spec("embed/embedding", emb_shape, mesh)), 2
    )
    assert not seen["embed"].is_fully_replicated
    assert one["probe"].seen["input_ids"].is_fully_replicated


def test_sharded_losses_equal_single_device(runs):
    _, one, sh = runs
    assert len(set(np.round(one["losses"], 6))) > 1  # the batches differ
    np.testing.assert_allclose(sh["losses"], one["losses"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(sh["grad_norms"], one["grad_norms"], rtol=1e-4, atol=1e-6)
    # AdamW divides by sqrt(v): a 1e-7 gradient difference on a near-zero gradient moves
    # a weight by up to ~lr, so the parameters agree to a fraction of the update (3 x lr)
    moved = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(
            jax.tree.leaves(host(one["state"].params)), jax.tree.leaves(host(one["params_init"]))
        )
    )
    assert moved > 5e-3
    for a, b in zip(
        jax.tree.leaves(host(sh["state"].params)), jax.tree.leaves(host(one["state"].params))
    ):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-3)


def test_weight_push_gathers_the_sharded_params(runs):
    ckpt, one, sh = runs
    from verltool_jax.models.config import ModelConfig

    cfg = ModelConfig.from_pretrained(ckpt)
    p_sh = pack_named_tensors(named_tensors_from_params(sh["state"].params, cfg))
    p_one = pack_named_tensors(named_tensors_from_params(one["state"].params, cfg))
    assert p_sh.names == p_one.names and p_sh.shapes == p_one.shapes
    assert p_sh.nbytes == p_one.nbytes > 0
    for name, a, b, _shape in zip(p_sh.names, p_sh.buffers, p_one.buffers, p_sh.shapes):
        np.testing.assert_allclose(
            np.frombuffer(a, np.float32),
            np.frombuffer(b, np.float32),
            rtol=0,
            atol=1e-3,
            err_msg=name,
        )
