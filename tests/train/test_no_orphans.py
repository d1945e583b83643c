"""Nothing left behind: ``python -m verltool_jax.train`` on the tiny_math smoke config is
killed with SIGKILL in the middle of an RL step and in the middle of a tool call, and no
process it started (tool server, sandboxes, reward worker and its resource tracker, the
vLLM engine core in the slow test) is alive a moment later.

``tests/support/orphans.py`` runs the trainer as a child subreaper, so an orphan stays its
descendant whatever its session or environment; its ``before`` list shows what there was
to leave behind (the test would fail without the lifeline: tests/runtime/test_lifeline.py checks
the switch-off case)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verltool_jax.runtime import lifeline

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not lifeline.supported(), reason="needs Linux /proc and pidfd")


def _kill_and_list(out: Path, when: str, entry: list[str], *overrides: str) -> dict:
    argv = [
        sys.executable,
        str(REPO / "tests/support/orphans.py"),
        "--when",
        when,
        "--out",
        str(out),
        "--",
        *entry,
        "--config",
        str(REPO / "configs/tiny_math.py") + ":smoke",
        "--config.sft.steps=0",
        f"--config.trainer.out_dir={out}",
        "--config.trainer.steps=50",
        "--config.logging.progress_bar=false",
        "--config.logging.plot=false",
        "--config.logging.tensorboard=false",
        "--config.data.max_eval_examples=0",
        "--config.reward.num_workers=1",
        *(f"--config.{o}" for o in overrides),
    ]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["not_killed_because"] is None, report["output_tail"]
    return report


def _kinds(procs: dict) -> set[str]:
    kinds = set()
    for cmd in procs.values():
        for marker, kind in (
            ("-m tool_server", "tool server"),
            ("bwrap", "sandbox"),
            ("spawn_main", "reward worker"),
            ("resource_tracker", "resource tracker"),
            ("verltool_jax.runtime.lifeline", "watchdog"),
            ("EngineCore", "engine core"),
        ):
            if marker in cmd:
                kinds.add(kind)
    return kinds


def test_sigkill_mid_step_leaves_no_process(tmp_path):
    report = _kill_and_list(
        tmp_path / "run",
        "step",
        [sys.executable, "-m", "verltool_jax.train"],
        "sampler.backend=jax",
    )
    assert {"tool server", "sandbox", "reward worker", "watchdog"} <= _kinds(report["before"])
    assert report["left"] == {}, report


def test_sigkill_mid_tool_call_leaves_no_process(tmp_path):
    """The sampler is scripted to call Python that sleeps 60 s: the kill lands while the
    sandboxed call runs (a forked call process of the fork server is alive)."""
    report = _kill_and_list(
        tmp_path / "run",
        "tool_call",
        [sys.executable, str(REPO / "tests/support/slow_tool_trainer.py")],
        "sampler.backend=jax",
    )
    assert {"tool server", "sandbox", "watchdog"} <= _kinds(report["before"])
    assert report["left"] == {}, report


@pytest.mark.slow
@pytest.mark.vllm
def test_sigkill_mid_step_with_the_vllm_engine_leaves_no_process(tmp_path):
    report = _kill_and_list(
        tmp_path / "run",
        "step",
        [sys.executable, "-m", "verltool_jax.train"],
        "sampler.backend=vllm",
    )
    assert {"tool server", "reward worker", "engine core"} <= _kinds(report["before"]), report
    assert report["left"] == {}, report
