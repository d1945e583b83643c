"""Remote samplers on stock vLLM servers (the OpenAI-compatible server, token ids in,
token ids and logprobs out) and the shared-memory weight transport.

The default tests run without a server: the bucketed shared-memory round trip the
workers use, the server command line, and a clear error for a server that is not there.
The slow test starts two real vLLM CPU servers on 127.0.0.1 and pools them with the
in-process engine: generation, sticky routing, weight sync with logprob parity after
it, and a server killed mid-request leaving the rotation with its requests retried.
"""

import asyncio
import json
import os
import time

import numpy as np
import pytest

from verltool_jax.samplers.base import SamplerDeadError, SamplingParams
from verltool_jax.samplers.remote_vllm import RemoteVLLMSampler, free_port, vllm_serve_argv
from verltool_jax.samplers.weight_sync import SharedWeightBuffer, open_shared_tensors, plan_buckets


def test_shared_memory_buckets_round_trip_fp32_and_bf16():
    import ml_dtypes
    import torch

    rng = np.random.default_rng(0)
    named = [
        (f"w{i}", rng.standard_normal(shape).astype(np.float32))
        for i, shape in enumerate([(300, 7), (5,), (64, 64), (1000,), (3, 3, 3)])
    ]
    assert plan_buckets([100, 100, 5000, 10], 256) == [[0, 1], [2], [3]]
    buf = SharedWeightBuffer(bucket_bytes=20_000)
    try:
        manifest = buf.write(named)
        assert buf.nbytes == sum(a.nbytes for _, a in named)
        cache = {}
        back = dict(open_shared_tensors(manifest, cache))
        assert len(cache) > 1  # really bucketed
        for n, a in named:
            np.testing.assert_array_equal(back[n].numpy(), a)
        # the next sync reuses the same segments and the engine sees the new values
        named2 = [(n, a + 1) for n, a in named]
        manifest2 = buf.write(named2, dtype="bfloat16")
        back2 = dict(open_shared_tensors(manifest2, cache))
        for n, a in named2:
            assert back2[n].dtype == torch.bfloat16
            want = a.astype(ml_dtypes.bfloat16).astype(np.float32)
            np.testing.assert_array_equal(back2[n].float().numpy(), want)
        with pytest.raises(ValueError, match="dtype"):
            buf.write(named, dtype="int8")
        with pytest.raises(ValueError, match="no tensors"):
            buf.write([])
    finally:
        paths = [b["path"] for b in json.loads(manifest)]
        buf.close()
    assert not any(os.path.exists(p) for p in paths)


def test_server_command_and_a_missing_server_is_a_clear_error():
    argv = vllm_serve_argv("/m", 8123, max_model_len=512)
    for flag in (
        "--logprobs-mode",
        "processed_logprobs",
        "--worker-extension-cls",
        "--generation-config",
        "--port",
        "8123",
    ):
        assert flag in argv
    assert "--no-enable-chunked-prefill" in argv  # this is a CPU host (docs/samplers.md)
    t0 = time.monotonic()
    with pytest.raises(SamplerDeadError, match="no vLLM server answers"):
        RemoteVLLMSampler(f"http://127.0.0.1:{free_port()}", connect_timeout_s=1)
    assert time.monotonic() - t0 < 10
    with pytest.raises(ValueError, match="http://"):
        RemoteVLLMSampler("127.0.0.1:8000")


# ---------------------------------------------------------------------------- slow
PROMPTS = [[5, 17, 42, 99, 7], [11, 3, 250, 8], [64, 65, 66, 67, 68, 69]]


def _perturbed(model, scale=0.05, seed=3):
    import jax
    from flax import nnx

    _, params = nnx.split(model, nnx.Param)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(
        tree, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    )


async def _gather(sampler, prompts, params, ids=None):
    ids = ids or [None] * len(prompts)
    return await asyncio.gather(
        *(sampler.generate(p, params, request_id=i) for p, i in zip(prompts, ids))
    )


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    from support.samplers import SAMPLER_MAX_MODEL_LEN, sampler_ckpt

    from verltool_jax.samplers.remote_vllm import VLLMServer

    logs = tmp_path_factory.mktemp("vllm_logs")
    ckpt = sampler_ckpt()
    servers = [
        VLLMServer(
            str(ckpt),
            max_model_len=SAMPLER_MAX_MODEL_LEN,
            wait=False,
            log_path=str(logs / f"server{i}.log"),
            max_num_seqs=32,
        )
        for i in range(2)
    ]
    try:
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.mark.slow
def test_two_vllm_servers_in_a_pool_with_an_in_process_engine(
    two_servers, vllm_sampler, sampler_flax_model
):
    from flax import nnx
    from support.samplers import restore_checkpoint_weights

    from verltool_jax.samplers.parity import logprob_parity
    from verltool_jax.samplers.pool import SamplerPool

    # external servers (not restartable from here): a dead one is waited for 2 s, then
    # leaves the rotation
    remotes = [RemoteVLLMSampler(s.url, request_timeout_s=300, down_grace_s=2) for s in two_servers]
    pool = SamplerPool([*remotes, vllm_sampler])
    try:
        # generation: token ids in, ids + logprobs out, the checkpoint's own numbers
        T = 0.8
        sp = SamplingParams(max_tokens=10, temperature=T, seed=1)
        for r in remotes:
            outs = asyncio.run(_gather(r, PROMPTS, sp))
            assert all(len(c.token_ids) == len(c.logprobs) == 10 for c in outs)
            par = logprob_parity(sampler_flax_model, list(zip(PROMPTS, outs)), T)
            assert par["mean_abs_diff"] < 1e-3, par
        # sticky routing: every engine used, each trajectory's turns on one engine
        tids = [f"traj{i}" for i in range(6)]
        prompts = [PROMPTS[i % 3] for i in range(6)]
        short = SamplingParams(max_tokens=4, temperature=1.0, seed=2)
        first = asyncio.run(_gather(pool, prompts, short, tids))
        second = asyncio.run(_gather(pool, prompts, short, tids))
        idx = [c.metrics["sampler_index"] for c in first]
        assert set(idx) == {0, 1, 2}
        assert [c.metrics["sampler_index"] for c in second] == idx
        # weight sync to every engine (shared memory), then parity with the new weights
        graphdef, _ = nnx.split(sampler_flax_model, nnx.Param)
        new = _perturbed(sampler_flax_model)
        pool.update_weights(new, version=4)
        new_model = nnx.merge(graphdef, new)
        for r in remotes:
            assert r.version == 4 and r.last_sync["sync_bytes"] > 0
            assert r.last_sync["sync_path"] == "inplace"  # the server's fast path
            outs = asyncio.run(_gather(r, PROMPTS, sp))
            assert all(c.policy_version == 4 for c in outs)
            par = logprob_parity(new_model, list(zip(PROMPTS, outs)), T)
            assert par["mean_abs_diff"] < 1e-3, par
        # a server killed mid-request leaves the rotation; its requests finish elsewhere
        victim = idx[0]
        on_victim = [t for t, i in zip(tids, idx) if i == victim]
        longer = SamplingParams(max_tokens=400, temperature=1.0, seed=3)

        async def kill_mid_flight():
            task = asyncio.ensure_future(
                _gather(pool, [PROMPTS[0]] * len(on_victim), longer, on_victim)
            )
            # kill as soon as the requests are on the victim (a fixed 1 s wait raced the
            # server: on a quiet machine the requests had finished by then)
            deadline = time.monotonic() + 30
            while pool.inflight[victim] == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert pool.inflight[victim] > 0
            await asyncio.sleep(0.1)  # the requests reach the server
            two_servers[victim].kill()
            return await task

        done = asyncio.run(kill_mid_flight())
        assert all(len(c.token_ids) > 0 for c in done)
        assert all(c.metrics["sampler_index"] != victim for c in done)
        assert pool.healthy[victim] is False
        later = asyncio.run(_gather(pool, prompts, short, [f"new{i}" for i in range(6)]))
        assert victim not in {c.metrics["sampler_index"] for c in later}
        pool.update_weights(new, version=5)  # the dead one is skipped
        assert remotes[1 - victim].version == 5
    finally:
        restore_checkpoint_weights(vllm_sampler)
        for r in remotes:
            r.close()


def test_publisher_logs_bytes_and_seconds_of_every_sync(vllm_sampler, sampler_flax_model):
    """The trainer's push (PolicyPublisher -> pool -> in-process engine through shared
    memory) reports the payload bytes and seconds of every sync."""
    import jax
    from support.samplers import restore_checkpoint_weights

    from verltool_jax import metric_names as names
    from verltool_jax.samplers.pool import SamplerPool
    from verltool_jax.train.policy_version import PolicyPublisher

    new = _perturbed(sampler_flax_model)
    pub = PolicyPublisher(SamplerPool([vllm_sampler]))
    try:
        pub.publish_now(new, 11)
        m = pub.sync_metrics()
        # fp32 payload = every parameter once (tied head: no separate lm_head)
        assert m[names.SYNC_BYTES] == sum(x.nbytes for x in jax.tree.leaves(new))
        assert m[names.SYNC_SECONDS] > 0 and m[names.SYNC_GBPS] > 0
        assert vllm_sampler.version == 11 and pub.syncs == 1
        last = dict(vllm_sampler.last_sync)
        assert last["pack_seconds"] + last["load_seconds"] <= last["sync_seconds"] + 1e-6
    finally:
        restore_checkpoint_weights(vllm_sampler)


@pytest.mark.slow
def test_an_owned_server_killed_mid_flight_restarts_resyncs_and_reissues(
    tmp_path, sampler_flax_model
):
    """A server this sampler started (``server=``) is SIGKILLed while requests run: it is
    restarted on its port, the synced weights (version 3) are loaded into it again before
    any request, and the requests complete with version 3's greedy tokens. A server the
    sampler does not own, down past ``down_grace_s``: SamplerDeadError naming it."""
    from support.samplers import SAMPLER_MAX_MODEL_LEN, sampler_ckpt

    from verltool_jax.samplers.base import SamplerDeadError
    from verltool_jax.samplers.remote_vllm import VLLMServer

    server = VLLMServer(
        str(sampler_ckpt()),
        max_model_len=SAMPLER_MAX_MODEL_LEN,
        log_path=str(tmp_path / "server.log"),
        max_num_seqs=32,
    )
    r = RemoteVLLMSampler(server.url, request_timeout_s=300, server=server, restart_backoff_s=0.1)
    try:
        greedy = SamplingParams(max_tokens=48, temperature=0)
        before = asyncio.run(_gather(r, PROMPTS, greedy))
        r.update_weights(_perturbed(sampler_flax_model, scale=0.5), version=3)
        expected = asyncio.run(_gather(r, PROMPTS, greedy))
        assert [c.token_ids for c in expected] != [c.token_ids for c in before]
        old_pid = server.pid

        async def kill_mid_flight():
            task = asyncio.ensure_future(_gather(r, PROMPTS, greedy))
            while r.load < len(PROMPTS):
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            server.kill()
            return await task

        got = asyncio.run(kill_mid_flight())
        assert r.budget.total == 1 and server.pid != old_pid and r.alive
        assert [c.token_ids for c in got] == [c.token_ids for c in expected]
        assert all(c.policy_version == 3 for c in got)
        external = RemoteVLLMSampler(server.url, down_grace_s=1)
        server.kill()
        with pytest.raises(SamplerDeadError, match="down_grace_s=1"):
            asyncio.run(external.generate(PROMPTS[0], greedy))
        assert not external.alive
        external.close()
    finally:
        r.close()
        server.stop()
