"""``python -m verltool_jax.eval`` on configs/vt_swe.py:tiny (the untrained tiny model, one
QuixBugs task, real tool server and sandbox): the SWE lines are printed and consistent
(resolve rate in [0, 1], sandbox time <= wall time <= the total, tokens within the
budget), and the scripted episodes' figures come from the same functions."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tool_server.sandbox import sandbox_status
from verltool_jax import eval as eval_cli
from verltool_jax.reporting.eval_metrics import format_swe_tasks, swe_eval_metrics

REPO = Path(__file__).resolve().parents[2]
QUIX = REPO / ".." / "shared" / "data" / "swe" / "quixbugs"


def test_swe_costs_from_trajectory_records():
    hid = {
        "extra_info": {
            "task_id": "gcd",
            "hidden_test_result": {"seconds": 2.0, "passed": 1, "failed": 5, "errors": 0},
        }
    }
    a = SimpleNamespace(
        tool_calls=2,
        invalid_tool_calls=0,
        termination="eos",
        data=hid,
        wall_time_s=10.0,
        tool_latencies=[1.0, 3.0],
        gen_latencies=[2.0, 1.0],
        gen_tokens=[30, 10],
    )
    b = SimpleNamespace(
        tool_calls=0,
        invalid_tool_calls=0,
        termination="budget",
        data=hid,
        wall_time_s=4.0,
        tool_latencies=[],
        gen_latencies=[1.5],
        gen_tokens=[64],
    )
    m = swe_eval_metrics([a, b], [1.0, 0.0], wall_s_total=12.0)
    assert m["swe/sandbox_s_per_task_mean"] == pytest.approx((6.0 + 2.0) / 2)
    assert m["swe/hidden_test_s_per_task_mean"] == 2.0
    assert m["swe/wall_s_per_task_mean"] == 7.0 and m["swe/wall_s_per_task_median"] == 7.0
    assert m["swe/gen_tokens_per_task_mean"] == 52.0 and m["swe/gen_s_per_task_mean"] == 2.25
    assert m["swe/wall_s_total"] == 12.0 and m["swe/resolve_rate"] == 0.5
    table = format_swe_tasks([a, b], [1.0, 0.0]).splitlines()
    assert len(table) == 3 and table[1].split()[:5] == ["gcd", "1.0", "2", "eos", "40"]
    assert table[1].split()[-1] == "1/5/0"


@pytest.mark.skipif(not (QUIX / "python_testcases").is_dir(), reason=f"no QuixBugs at {QUIX}")
@pytest.mark.skipif(not sandbox_status()[0], reason=f"no sandbox: {sandbox_status()[1]}")
def test_eval_prints_swe_metrics(tmp_path, capfd):
    out_json = tmp_path / "eval.json"
    rc = eval_cli.main(
        [
            "--config",
            f"{REPO}/configs/vt_swe.py:tiny",
            "--checkpoint",
            "base",
            f"--config.task.quixbugs_dir={QUIX}",
            "--config.task.programs=('gcd',)",
            "--config.task.mutants_per_program=0",
            f"--config.trainer.out_dir={tmp_path / 'run'}",
            "--config.sampler.backend=jax",
            "--config.logging.progress_bar=false",
            "--json",
            str(out_json),
        ]
    )
    assert rc == 0
    out = capfd.readouterr().out
    assert "[eval] SWE tasks (greedy):" in out and "[eval] SWE: 1 tasks" in out
    for key in (
        "swe/resolve_rate",
        "swe/tool_calls_per_task",
        "swe/wall_s_per_task_mean",
        "swe/wall_s_per_task_median",
        "swe/sandbox_s_per_task_mean",
        "swe/gen_tokens_per_task_mean",
        "swe/wall_s_total",
    ):
        assert f"{key} = " in out, key
    res = json.loads(out_json.read_text())["swe"]
    m, (task,) = res["metrics"], res["tasks"]
    assert task["task_id"] == "gcd" and m["swe/resolve_rate"] in (0.0, 1.0)
    assert task["reward"] == m["swe/resolve_rate"]
    # the hidden tests ran in the sandbox: the buggy gcd fails 5 of 6 unless the model fixed it
    assert task["hidden"]["passed"] + task["hidden"]["failed"] >= 6
    assert 0 < task["hidden_test_s"] <= task["sandbox_s"] <= task["wall_s"] <= m["swe/wall_s_total"]
    assert m["swe/sandbox_s_per_task_mean"] == pytest.approx(task["sandbox_s"])
    assert 0 < m["swe/gen_tokens_per_task_mean"] <= 32  # tiny: 32 response tokens
    assert sum(v for k, v in m.items() if k.startswith("swe/ended/")) == pytest.approx(1.0)
