"""benchmarks/model_step.py end to end at a toy size: both frameworks' worker processes
start, step in turn, and the ratio line is printed from their timings."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_model_step_runs_each_framework_in_its_own_worker():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/model_step.py"), "--hidden", "32", "--layers",
         "1", "--heads", "2", "--kv-heads", "1", "--intermediate", "64", "--vocab", "128",
         "--batch", "2", "--seq", "16", "--rounds", "2", "--skip-memory-table"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rounds = re.findall(r"round (\d) (JAX/Flax|PyTorch)\s+([\d.]+) ms", out.stdout)
    assert [(r, fw) for r, fw, _ in rounds] == [("0", "JAX/Flax"), ("0", "PyTorch"),
                                                ("1", "JAX/Flax"), ("1", "PyTorch")]
    assert all(float(ms) > 0 for *_, ms in rounds)
    assert re.search(r"throughput ratio JAX / PyTorch \(\d thread\(s\)\): [\d.]+x", out.stdout)
    assert "GLIBC_TUNABLES=" in out.stdout
