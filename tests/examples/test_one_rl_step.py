"""``examples/one_rl_step.py`` runs as documented and does one real update: GRPO's
advantages of one right and one wrong answer per group, the batch, and the train step
moving the policy from version 0 to 1 with a finite, non-zero gradient."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_one_rl_step_example_runs_and_updates_the_policy():
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "one_rl_step.py")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},  # this checkout's code
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "advantages [ 0.707 -0.707  0.707 -0.707]" in out
    assert "'input_ids': (4, 16)" in out
    grad = float(re.search(r"grad_norm (\S+)", out).group(1))
    assert 0.0 < grad < float("inf")
    m = re.search(r"policy version 0 -> 1; largest change (\S+)", out)
    assert m and 0.0 < float(m.group(1)) < 0.05  # about lr = 0.01 (Adam's first step)
