"""Multi-host training for real: two JAX processes on the CPU (jax.distributed over
localhost, gloo collectives), started by ``launch/multiprocess.sh``, train the tiny_math
smoke config, stop after step 1, and resume from their two-process checkpoint for step 2.

"Same data" is made exact by replay, since sampling is not seeded per request (two runs
never sample the same tokens): process 0 dumps the global batch's trajectories of every
step (``logging.dump_trajectories``), and one process, from the same start (the same tiny
model and SFT warm start), trains on those trajectories with ``make_batch`` and ``train_on``; its losses must
equal the losses the two processes logged, and its params after step 2 the two-process
checkpoint. The prompts of each step must be the ones one process would have taken, in
the same order (the strided share per process, kept across the resume).

The fast tests check the helpers' single-process answers and errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from verltool_jax.cli import parse_command_line
from verltool_jax.train import multihost

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = (
    "sampler.backend=jax",
    "rollout.mode=sync",
    "logging.progress_bar=false",
    "logging.plot=false",
    "logging.dump_trajectories=true",
    "logging.tensorboard=false",
    # non-zero advantages (length penalty) and a loss that is never 0 (entropy)
    "algo.overlong_buffer_len=40",
    "algo.entropy_coef=0.01",
    "data.max_eval_examples=2",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path, steps: int, logs: Path, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(
        NUM_PROCESSES="2",
        DEVICES_PER_PROCESS="1",
        PLATFORM="cpu",
        COORDINATOR_PORT=str(_free_port()),
        OUT=str(logs),
    )
    cmd = [
        "bash",
        str(REPO / "launch/multiprocess.sh"),
        "configs/tiny_math.py:smoke",
        f"--config.trainer.out_dir={out}",
        f"--config.trainer.steps={steps}",
        "--config.mesh_shape=(1,-1,1)",
    ] + [f"--config.{o}" for o in OVERRIDES + extra]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    other = (logs / "process1.console").read_text() if (logs / "process1.console").exists() else ""
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n--- process 1:\n{other}"
    return r.stdout


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("multihost")
    out = base / "run"
    first = _launch(out, 1, base / "logs1")
    second = _launch(out, 2, base / "logs2", "checkpoint.export_hf=true")
    return dict(out=out, first=first, second=second)


def _flat(params) -> dict:
    return {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }


def _index(group_id: str) -> int:
    return int(group_id.rsplit("-", 1)[1])


@pytest.mark.slow
def test_two_processes_train_resume_and_match_one_process(two_process_run, tmp_path):
    from verltool_jax.algos.optimizer import make_optimizer
    from verltool_jax.rollout.trajectory import load_trajectories
    from verltool_jax.train import build
    from verltool_jax.train.batch import make_batch
    from verltool_jax.train.checkpoint import Checkpointer
    from verltool_jax.train.sft import run_sft
    from verltool_jax.train.state import TrainState
    from verltool_jax.train.step import make_train_step, train_on

    out = two_process_run["out"]

    # process 0 alone wrote the metrics (one record per step), both ran, the second resumed
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in rl] == [1, 2]
    assert "resumed from" in two_process_run["second"] and "at step 1" in two_process_run["second"]
    assert (out / "run.process1.log").exists() and json.loads((out / "summary.json").read_text())[
        "steps"
    ] == 2
    data = json.loads(next((out / "checkpoints/2/data").glob("*")).read_text())
    assert data["process_count"] == 2 and len(data["processes"]) == 2
    assert all(r["rollout/num"] == 4 for r in rl)  # global: 2 groups x 2 samples
    evals = [r for r in records if "eval/num" in r]
    # after SFT and final (run 1), at the start and final (run 2); one item per process
    assert [r["step"] for r in evals] == [0, 1, 1, 2] and all(r["eval/num"] == 2 for r in evals)

    # the prompts of each step are the ones one process takes, in its order
    cfg = parse_command_line(
        [
            "--config",
            str(REPO / "configs/tiny_math.py") + ":smoke",
            f"--config.trainer.out_dir={tmp_path / 'ref'}",
            f"--config.model.path={out / 'init_model'}",
        ]
        + [f"--config.{o}" for o in OVERRIDES]
    ).config
    steps = {k: load_trajectories(out / "trained" / f"step_{k:05d}.jsonl") for k in (1, 2)}
    with build.build_run(cfg) as run:
        order = [e.index for e in run.prompt_pipeline().next_batch(4)]
        taken = []
        for k in (1, 2):
            gids = list(dict.fromkeys(t.group_id for t in steps[k]))
            assert [g[:2] for g in gids] == ["p0", "p1"]  # one group per process
            taken += [_index(g) for g in gids]
        assert taken == order

        # one process, same start, same trajectories: the same losses and params
        rc = run.config
        algo = rc.algo_for_run()
        optimizer = make_optimizer(rc.optimizer_for_run())
        state = TrainState.create(run_sft(run), optimizer, seed=rc.trainer.seed)
        train_step = make_train_step(algo, state.graphdef, optimizer, donate=False)
        for k, logged in zip((1, 2), rl):
            batch = make_batch(rc, algo, steps[k], run.pad_id, state.model)
            assert batch is not None
            state, m = train_on(train_step, state, batch)
            for key in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm"):
                assert m[key] == pytest.approx(logged[key], rel=1e-5, abs=1e-7), (k, key)
            assert m["train/loss"] != 0.0
        saved, _ = Checkpointer(out / "checkpoints").restore(
            TrainState.create(run.model, optimizer, seed=rc.trainer.seed)
        )
    assert int(saved.step) == 2
    mine, theirs = _flat(state.params), _flat(saved.params)
    assert mine.keys() == theirs.keys()
    # the HF export (process 0, from the gathered params) is the checkpoint's policy
    from flax import nnx

    from verltool_jax.models.hf_io import load_hf

    exported = _flat(nnx.state(load_hf(out / "hf_model"), nnx.Param))
    assert exported.keys() == theirs.keys()
    for k in exported:
        np.testing.assert_array_equal(exported[k], theirs[k], err_msg=k)
    # Adam divides by sqrt(v): where a gradient is ~0, its update (up to lr = 1e-4 per
    # step) depends on the reduction order (2 devices in 2 processes vs one), so a few
    # such elements differ by a few 1e-6; atol = 0.2 lr bounds that.
    for k in mine:
        np.testing.assert_allclose(mine[k], theirs[k], rtol=1e-5, atol=2e-5, err_msg=k)


# ---------------------------------------------------------------- two real processes, fast
HELPERS_SCRIPT = r"""
import json
import jax, numpy as np
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.sharding import batch_sharding, make_mesh
from support.sharding import shard_state
from verltool_jax.train import multihost

assert multihost.start() and multihost.is_multi()
p = multihost.process_index()
out = {"primary": multihost.is_primary(),
       "json": multihost.gather_json({"p": p}),
       "all": [multihost.all_true(p == 0), multihost.all_true(True)],
       "any": [multihost.any_true(p == 0), multihost.any_true(False)],
       "data": multihost.data_state({"prompts": {"consumed": 10 + p}, "replay": [p]})}
out["mine"] = multihost.my_data_state(out["data"])
groups = [[Trajectory(f"p{p}g{j}-0", f"p{p}g{j}", [1, 2], response_ids=[3], loss_mask=[1],
                      logprobs=[-0.5], versions=[0], reward=float(p + j))]
          for j in range(2)]
union = multihost.gather_groups(groups)
out["union"] = [g[0].group_id for g in union]
out["own_kept"] = union[p][0] is groups[0][0]
mesh = make_mesh((1, -1, 1))
x = np.arange(24, dtype=np.float32).reshape(8, 3)
g = jax.device_put(x, batch_sharding(mesh))          # every process has the same host batch
out["global_sum"] = float(jax.jit(lambda a: (a * a).sum())(g))
params = shard_state({"embed": {"embedding": np.arange(16, dtype=np.float32).reshape(4, 4)}},
                     mesh)
local = multihost.local_copy(params)
arr = local["embed"]["embedding"]
out["local_copy"] = [arr.is_fully_addressable, np.asarray(arr).tolist() ==
                     np.arange(16).reshape(4, 4).tolist()]
step = multihost.globalize({"step": jax.numpy.zeros((), jax.numpy.int32)}, mesh)["step"]
out["globalized"] = step.sharding.mesh == mesh and int(step) == 0
try:
    multihost.check_batch_groups(3)
except ValueError as e:
    out["error"] = str(e)
multihost.barrier("done")
print("RESULT " + json.dumps(out), flush=True)
"""


def test_helpers_across_two_real_processes():
    """The collectives of multihost.py in two real jax.distributed processes (CPU, gloo)."""
    port = _free_port()
    procs = []
    for pid in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
        env.update(
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(pid),
            JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=1",
            PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")]),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", HELPERS_SCRIPT],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=REPO,
            )
        )
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    res = []
    for out, err in outs:
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, err[-3000:]
        res.append(json.loads(lines[0][7:]))
    for p, r in enumerate(res):
        assert r["primary"] == (p == 0)
        assert r["json"] == [{"p": 0}, {"p": 1}]
        assert r["all"] == [False, True] and r["any"] == [True, False]
        assert r["data"]["process_count"] == 2
        assert [d["replay"] for d in r["data"]["processes"]] == [[0], [1]]
        assert r["mine"] == {"prompts": {"consumed": 10 + p}, "replay": [p]}
        # interleaved: group j of process 0, group j of process 1, ...
        assert r["union"] == ["p0g0", "p1g0", "p0g1", "p1g1"]
        assert r["own_kept"]
        assert r["global_sum"] == float((np.arange(24.0) ** 2).sum())
        assert r["local_copy"] == [True, True] and r["globalized"]
        assert "trainer.batch_groups=3" in r["error"] and "(2)" in r["error"]


# ---------------------------------------------------------------- single-process helpers
def test_single_process_helpers_are_trivial():
    assert not multihost.is_multi() and multihost.is_primary()
    assert multihost.gather_json({"a": 1}) == [{"a": 1}]
    assert multihost.all_true(True) and not multihost.any_true(False)
    groups = [[object()], [object()]]
    assert multihost.gather_groups(groups) == groups
    tree = {"x": np.ones(3)}
    assert multihost.local_copy(tree) is tree
    assert multihost.data_state({"prompts": 1}) == {"prompts": 1}
    assert multihost.my_data_state({"prompts": 1}) == {"prompts": 1}


def test_prompt_share_is_strided_and_covers_every_position():
    shares = [[i for i in range(12) if multihost.my_share(i, p, 3)] for p in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    assert multihost.check_batch_groups(8, 4) == 2


def test_bad_batch_groups_and_process_count_name_the_fix():
    with pytest.raises(
        ValueError,
        match=r"trainer.batch_groups=3 .* multiple of the number "
        r"of processes \(2\)",
    ):
        multihost.check_batch_groups(3, 2)
    saved = {"processes": [{"prompts": 1}, {"prompts": 2}], "process_count": 2}
    with pytest.raises(ValueError, match="written by 2 processes, this run has 1"):
        multihost.my_data_state(saved)
