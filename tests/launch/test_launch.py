"""Placement in the config and the launch scripts: every script's ``--dry-run`` prints
the exact commands and environment, the placement fields are validated and reach the
mesh and the engines, and ``local_cluster.sh`` runs for real (slow)."""

import dataclasses
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from verltool_jax.run_config import PlacementSection, RunConfig

ROOT = Path(__file__).resolve().parents[2]


def _script(name, *args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TPU_"))}
    e.update(env or {})
    r = subprocess.run(
        ["bash", str(ROOT / "launch" / name), *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    return [ln[3:] for ln in r.stdout.splitlines() if ln.startswith(("== ", "## "))]


def test_local_dry_run_prints_one_command_per_arg():
    lines = _script(
        "local.sh",
        "--dry-run",
        "configs/tiny_math.py",
        "smoke",
        "sync",
        "--",
        "--config.trainer.steps=3",
    )
    assert lines[0].startswith("env ") and "VLLM_CPU_KVCACHE_SPACE=" in lines[0]
    assert lines[1:] == [
        "python -m verltool_jax.train --config configs/tiny_math.py:smoke "
        "--config.trainer.out_dir=runs/tiny_math_smoke --config.trainer.steps=3",
        "python -m verltool_jax.train --config configs/tiny_math.py:sync "
        "--config.trainer.out_dir=runs/tiny_math_sync --config.trainer.steps=3",
    ]


def test_local_cluster_dry_run_lists_replicas_servers_and_placement():
    lines = _script(
        "local_cluster.sh",
        "--dry-run",
        "configs/tiny_math.py:smoke",
        "--config.trainer.steps=2",
        env={
            "TOOL_REPLICAS": "2",
            "TOOL_PORT": "40000",
            "VLLM_SERVERS": "2",
            "VLLM_PORT": "41000",
            "MODEL": "/ckpt",
            "OUT": "/tmp/x",
        },
    )
    assert lines[0].startswith("env ") and "PYTHONPATH=" in lines[0]
    assert lines[1] == (
        "python -m tool_server --host 127.0.0.1 --port 40000 --tools "
        "python_code > /tmp/x/tool_server_0.log &"
    )
    assert lines[3] == (
        "python -m verltool_jax.samplers.remote_vllm /ckpt --port 41000 "
        "--max-model-len 2048 --seed 0 > /tmp/x/vllm_server_0.log &"
    )
    assert lines[-1] == (
        "python -m verltool_jax.train --config configs/tiny_math.py:smoke "
        "--config.tool_server.url=http://127.0.0.1:40000,http://127.0.0.1:40001 "
        "--config.placement.mode=remote "
        "--config.placement.sampler_urls=http://127.0.0.1:41000,http://127.0.0.1:41001 "
        "--config.trainer.steps=2"
    )
    # the server command it runs prints the exact vLLM command line
    r = subprocess.run(
        [
            "python",
            "-m",
            "verltool_jax.samplers.remote_vllm",
            "/ckpt",
            "--port",
            "41000",
            "--print",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert "VLLM_SERVER_DEV_MODE=1" in r.stdout and "vllm.entrypoints.openai.api_server" in r.stdout
    assert "--worker-extension-cls" in r.stdout


def test_gpu_slurm_tpu_dry_runs():
    gpu = _script("gpu_node.sh", "--dry-run", "configs/tiny_math.py", env={"NUM_GPUS": "4"})
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.5" in gpu[1]
    assert gpu[2].startswith(
        "python -m verltool_jax.train --config configs/tiny_math.py "
        "--config.sampler.backend=vllm --config.sampler.num_engines=4"
    )
    slurm = _script(
        "slurm_multinode.sh", "--dry-run", "configs/tiny_math.py", env={"HEAD_NODE": "n7"}
    )
    assert "COORDINATOR_ADDRESS=n7:12355" in slurm[0]
    assert slurm[1].startswith("srun --nodes=1 --ntasks=1 -w n7 --overlap python -m tool_server")
    assert (
        slurm[2].startswith("srun --ntasks-per-node=1")
        and "--config.tool_server.url=http://n7:30888" in slurm[2]
    )
    tpu = _script(
        "tpu_pod.sh",
        "--dry-run",
        "configs/tiny_math.py",
        env={"TPU_NAME": "pod", "ZONE": "z", "HOST0_IP": "10.0.0.2"},
    )
    assert tpu[0].startswith("tar czf")
    assert "python -m verltool_jax.train --config configs/tiny_math.py" in tpu[-1]
    assert "--config.tool_server.url=http://10.0.0.2:30888" in tpu[-1]


def test_multiprocess_dry_run_gives_each_process_its_env():
    lines = _script(
        "multiprocess.sh",
        "--dry-run",
        "configs/tiny_math.py:smoke",
        "--config.mesh_shape=(1,-1,1)",
        env={
            "NUM_PROCESSES": "3",
            "DEVICES_PER_PROCESS": "2",
            "COORDINATOR_PORT": "40001",
            "OUT": "/tmp/x",
        },
    )
    assert lines[0].startswith("env ") and "PYTHONPATH=" in lines[0]
    cmd = (
        "python -m verltool_jax.train --config configs/tiny_math.py:smoke "
        "--config.mesh_shape=(1,-1,1)"
    )
    assert lines[1:] == [
        f"JAX_COORDINATOR_ADDRESS=127.0.0.1:40001 JAX_NUM_PROCESSES=3 JAX_PROCESS_ID={i} "
        f"JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2 {cmd}"
        + (" &" if i == 0 else f" > /tmp/x/process{i}.console &")
        for i in range(3)
    ]
    gpu = _script(
        "multiprocess.sh",
        "--dry-run",
        "configs/tiny_math.py",
        env={"PLATFORM": "gpu", "DEVICES_PER_PROCESS": "4"},
    )
    assert "JAX_PROCESS_ID=1 CUDA_VISIBLE_DEVICES=4,5,6,7 python" in gpu[2]


def test_placement_validation_names_the_field():
    assert PlacementSection().mode == "colocated"
    ok = PlacementSection(mode="disjoint", trainer_devices=(0, 1), sampler_devices=(2, 3))
    assert ok.sampler_devices == (2, 3)
    bad = [
        (dict(mode="disjoint", trainer_devices=(0, 1), sampler_devices=(1, 2)), "both"),
        (dict(mode="disjoint", trainer_devices=(0,)), "sampler_devices"),
        (dict(mode="remote"), "sampler_urls"),
        (dict(sampler_devices=(1,)), "only read with mode='disjoint'"),
        (dict(sampler_urls=("localhost:8000",)), "sampler_urls"),
        (dict(trainer_devices=(0, 0)), "trainer_devices"),
        (dict(mode="elsewhere"), "mode"),
    ]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            PlacementSection(**kw)
    from configs import base
    from verltool_jax.run_config import run_config_from_dict

    c = base.get_config()
    c.placement.mode = "remote"
    with pytest.raises(ValueError, match="sampler_urls"):
        run_config_from_dict(c)


def test_placement_reaches_the_mesh_and_the_engines():
    import jax

    from verltool_jax.train.build import engine_device_env, trainer_devices, trainer_mesh

    devs = jax.devices()
    if len(devs) < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (scripts/test.sh)")
    rc = dataclasses.replace(
        RunConfig(),
        mesh_shape=(2, 1, 2),
        placement=PlacementSection(
            mode="disjoint", trainer_devices=(4, 5, 6, 7), sampler_devices=(0, 1)
        ),
    )
    assert trainer_devices(rc, devs) == devs[4:]
    mesh = trainer_mesh(rc)
    assert sorted(d.id for d in mesh.devices.flat) == [d.id for d in devs[4:]]
    rc2 = dataclasses.replace(rc, sampler=dataclasses.replace(rc.sampler, num_engines=2))
    assert [engine_device_env(rc2, i) for i in range(2)] == [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]
    with pytest.raises(ValueError, match="one engine per sampler device"):
        engine_device_env(rc, 0)  # num_engines 1 vs 2 devices
    assert engine_device_env(RunConfig(), 0) == {}
    far = dataclasses.replace(rc, placement=PlacementSection(trainer_devices=(99,)))
    with pytest.raises(ValueError, match="trainer_devices"):
        trainer_devices(far, devs)


def _free_port_pair() -> int:
    for _ in range(50):
        s1, s2 = socket.socket(), socket.socket()
        try:
            s1.bind(("127.0.0.1", 0))
            port = s1.getsockname()[1]
            s2.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
        finally:
            s1.close()
            s2.close()
    raise RuntimeError("no two consecutive free ports")


@pytest.mark.slow
def test_local_cluster_runs_for_real_with_two_tool_replicas(tmp_path):
    port = _free_port_pair()
    env = dict(
        os.environ,
        TOOL_REPLICAS="2",
        TOOL_PORT=str(port),
        OUT=str(tmp_path / "logs"),
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
    )
    r = subprocess.run(
        [
            "bash",
            "launch/local_cluster.sh",
            "configs/tiny_math.py:smoke",
            "--config.sampler.backend=jax",
            "--config.trainer.steps=1",
            f"--config.trainer.out_dir={tmp_path / 'run'}",
            "--config.logging.progress_bar=false",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    urls = f"http://127.0.0.1:{port},http://127.0.0.1:{port + 1}"
    assert f"--config.tool_server.url={urls}" in r.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("weight_sync/seconds" in r for r in rows)  # every sync is logged
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["tool_server"]["url"] == urls
    for i in range(2):  # both replicas stopped afterwards
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port + i)) != 0
