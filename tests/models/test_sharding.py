"""Mesh sharding on 8 simulated CPU devices: each parameter split as its rule says, and the
sharded forward and gradient equal the single-device ones. Multi-host start-up."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from support.models import padded_batch, tiny_ckpt
from support.sharding import shard_model, state_shardings

from verltool_jax.models.hf_io import load_hf
from verltool_jax.sharding import (
    batch_sharding,
    distributed_init_kwargs,
    make_mesh,
    param_spec,
)

needs8 = pytest.mark.skipif(
    jax.device_count() < 8,
    reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (scripts/test.sh sets it)",
)

# What the rules promise for the tiny qwen2 model (hidden 128, 2 heads x 64, 1 kv head,
# intermediate 256, vocab 512) on mesh (data=1, fsdp=4, tp=2): the local shard shapes.
EXPECTED_SHARDS = {
    ("embed", "embedding"): (512 // 2, 128 // 4),
    ("layers", 0, "attn", "q_proj", "kernel"): (128 // 4, 128 // 2),
    ("layers", 0, "attn", "k_proj", "kernel"): (128 // 4, 64 // 2),
    ("layers", 0, "attn", "q_proj", "bias"): (128 // 2,),
    ("layers", 1, "attn", "o_proj", "kernel"): (128 // 2, 128 // 4),
    ("layers", 1, "mlp", "gate_proj", "kernel"): (128 // 4, 256 // 2),
    ("layers", 1, "mlp", "down_proj", "kernel"): (256 // 2, 128 // 4),
    ("layers", 1, "input_norm", "weight"): (128,),
    ("final_norm", "weight"): (128,),
}


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices")
    return make_mesh((1, 4, 2))


@needs8
def test_load_hf_places_each_param_per_rule(mesh):
    model = load_hf(tiny_ckpt("qwen2"), mesh=mesh)
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for path, var in flat.items():
        arr = var.get_value()
        assert arr.sharding == NamedSharding(mesh, param_spec(path, arr.shape, mesh)), path
        assert len(arr.sharding.device_set) == 8
    for path, shard_shape in EXPECTED_SHARDS.items():
        arr = flat[path].get_value()
        assert {s.data.shape for s in arr.addressable_shards} == {shard_shape}, path
    ref = load_hf(tiny_ckpt("qwen2"))
    for path, var in nnx.to_flat_state(nnx.state(ref, nnx.Param)):
        np.testing.assert_array_equal(np.asarray(flat[path].get_value()), var.get_value())


@needs8
def test_sharded_forward_and_grad_equal_single_device(mesh):
    # llama: untied lm_head and GQA (4 query heads, 2 kv heads); qwen2's biases are placed above
    path = tiny_ckpt("llama", False)
    ids, mask = map(jnp.asarray, padded_batch(seed=8))

    def loss(graphdef, params, ids, mask):
        logits = nnx.merge(graphdef, params)(ids, mask)
        return (jax.nn.logsumexp(logits, -1) * mask).sum() / mask.sum(), logits

    single = load_hf(path)
    gd, params = nnx.split(single, nnx.Param)
    (l0, logits0), g0 = jax.jit(jax.value_and_grad(lambda p: loss(gd, p, ids, mask), has_aux=True))(
        params
    )

    sharded = shard_model(load_hf(path), mesh)
    gd1, params1 = nnx.split(sharded, nnx.Param)
    p_sh = state_shardings(params1, mesh)
    b_sh = batch_sharding(mesh)
    step = jax.jit(
        jax.value_and_grad(lambda p, i, a: loss(gd1, p, i, a), has_aux=True),
        in_shardings=(p_sh, b_sh, b_sh),
        out_shardings=((None, b_sh), p_sh),
    )
    with jax.set_mesh(mesh):
        (l1, logits1), g1 = step(params1, jax.device_put(ids, b_sh), jax.device_put(mask, b_sh))
    assert logits1.sharding.spec == P(("data", "fsdp"), None)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(logits1), np.asarray(logits0), atol=1e-4)
    flat0 = dict(nnx.to_flat_state(g0))
    for k, v in nnx.to_flat_state(g1):
        a = v.get_value()
        assert a.sharding.spec == param_spec(k, a.shape, mesh), k
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(flat0[k].get_value()), atol=2e-5, rtol=1e-4
        )


def test_make_mesh_shapes_and_errors():
    n = jax.device_count()
    m = make_mesh((1, -1, 1))
    assert m.axis_names == ("data", "fsdp", "tp") and m.shape["fsdp"] == n
    with pytest.raises(ValueError, match="mesh_shape"):
        make_mesh((n + 1, 1, 1))
    with pytest.raises(ValueError, match="mesh_shape"):
        make_mesh((1, 1))
    with pytest.raises(ValueError, match="PARAM_RULES"):
        param_spec("layers/0/attn/new_thing/kernel", (4, 4), m)


def test_distributed_init_kwargs_from_environment():
    assert distributed_init_kwargs({}) is None
    assert distributed_init_kwargs({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) is None
    assert distributed_init_kwargs({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16"}) == {}
    assert distributed_init_kwargs({"TPU_WORKER_HOSTNAMES": "a,b,c,d"}) == {}
    assert distributed_init_kwargs({"TPU_WORKER_HOSTNAMES": "localhost"}) is None
    kw = distributed_init_kwargs(
        {
            "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
            "JAX_NUM_PROCESSES": "4",
            "JAX_PROCESS_ID": "2",
            "JAX_LOCAL_DEVICE_IDS": "0,1",
        }
    )
    assert kw == dict(
        coordinator_address="10.0.0.1:1234", num_processes=4, process_id=2, local_device_ids=[0, 1]
    )
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES"):
        distributed_init_kwargs({"JAX_COORDINATOR_ADDRESS": "h:1"})


def test_init_distributed_two_real_processes():
    """Two processes on this machine join one jax.distributed cluster from env variables."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent("""
        import jax
        from verltool_jax.sharding import init_distributed
        assert init_distributed()
        print("RESULT", jax.process_index(), jax.process_count(), jax.device_count(),
              jax.local_device_count(), flush=True)
        jax.distributed.shutdown()
    """)
    procs = []
    for pid in range(2):
        env = dict(
            os.environ,
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(pid),
            XLA_FLAGS="--xla_force_host_platform_device_count=2",
            JAX_PLATFORMS="cpu",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = sorted(
        line.split()[1:]
        for out, _ in outs
        for line in out.splitlines()
        if line.startswith("RESULT")
    )
    assert results == [["0", "2", "4", "2"], ["1", "2", "4", "2"]], outs
