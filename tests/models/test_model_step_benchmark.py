"""benchmarks/model_step.py end to end at a toy size: both frameworks' worker processes
start, step in turn, and the ratio line is printed from their timings."""

import re
import subprocess
import sys
from pathlib import Path

from verltool_jax.runtime.malloc_tuning import KEEP_FREED_TUNABLES, TUNABLES_GLIBC, glibc_version

ROOT = Path(__file__).resolve().parents[2]


def _run(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/model_step.py"),
            "--hidden",
            "32",
            "--heads",
            "2",
            "--kv-heads",
            "1",
            "--intermediate",
            "64",
            "--vocab",
            "128",
            "--batch",
            "2",
            "--seq",
            "16",
            "--skip-memory-table",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def test_model_step_runs_each_framework_in_its_own_worker():
    out = _run("--layers", "1", "--rounds", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    rounds = re.findall(r"round (\d) (JAX/Flax|PyTorch)\s+([\d.]+) ms", out.stdout)
    assert [(r, fw) for r, fw, _ in rounds] == [
        ("0", "JAX/Flax"),
        ("0", "PyTorch"),
        ("1", "JAX/Flax"),
        ("1", "PyTorch"),
    ]
    assert all(float(ms) > 0 for *_, ms in rounds)
    assert re.search(r"throughput ratio JAX / PyTorch \(\d thread\(s\)\): [\d.]+x", out.stdout)
    assert "GLIBC_TUNABLES=" in out.stdout
    assert "JAX remat none, scan_layers auto (off)," in out.stdout  # the model's defaults
    if (glibc_version() or (0, 0)) >= TUNABLES_GLIBC:  # freed memory kept
        assert all(t in out.stdout for t in KEEP_FREED_TUNABLES)
    assert re.search(r"JAX/Flax .*\(compile [\d.]+ s, XLA temp [\d.]+ GiB\)", out.stdout)


def test_model_step_jax_alone_with_the_model_options():
    """``--frameworks jax``: no PyTorch worker and no ratio; the JAX model's remat,
    layer-scan and causal-block settings and the pause are the ones asked for; a bad
    framework name is a clear error."""
    out = _run(
        "--layers",
        "3",
        "--rounds",
        "1",
        "--frameworks",
        "jax",
        "--remat",
        "full",
        "--scan-layers",
        "off",
        "--causal-block",
        "8",
        "--pause",
        "0.5",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "JAX remat full, scan_layers off (off), attention_causal_block 8; pause before "
        "each step 0.5 s"
    ) in out.stdout
    assert re.findall(r"round (\d) (JAX/Flax|PyTorch)", out.stdout) == [("0", "JAX/Flax")]
    assert "fwd+bwd PyTorch" not in out.stdout and "throughput ratio" not in out.stdout
    bad = _run("--frameworks", "jax,tensorflow")
    assert bad.returncode == 2 and "--frameworks: unknown ['tensorflow']" in bad.stderr
