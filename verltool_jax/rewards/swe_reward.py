"""SWE: 1 iff the hidden tests pass and the previously passing tests still pass.

The repository state lives in the tool server's workspace, so the reward cannot be
computed from the response text: the agent loop runs the task's hidden test command
(``extra_info["hidden_test_cmd"]``) through the ``run_tests`` tool before the trajectory is
released (:mod:`verltool_jax.rollout.final_check`) and puts the run's metrics into
``extra_info["hidden_test_result"]``. The score is then
:func:`swe_reward_from_result` with ``n_expected =
|FAIL_TO_PASS| + |PASS_TO_PASS|`` from the ground truth.
"""

from __future__ import annotations

from typing import Any

from verltool_jax.rewards.base import RewardResult, register_reward


def swe_reward_from_result(result: dict, n_expected: int) -> float:
    """1.0 iff the hidden run exited 0, nothing failed or errored, and at least
    ``n_expected`` (= |FAIL_TO_PASS| + |PASS_TO_PASS|) tests passed; else 0.0.
    ``result``: the ``run_tests`` metrics (passed, failed, errors, exit_code, timed_out)."""
    ok = (
        result.get("exit_code") == 0
        and not result.get("timed_out")
        and int(result.get("failed", 0)) == 0
        and int(result.get("errors", 0)) == 0
        and int(result.get("passed", 0)) >= max(1, n_expected)
    )
    return 1.0 if ok else 0.0


@register_reward("swe", "swe", "quixbugs", "swebench")
def swe_reward(response_text: str, ground_truth: Any, extra_info: dict) -> RewardResult:
    """1.0 iff ``extra_info["hidden_test_result"]`` shows every listed test passing."""
    result = (extra_info or {}).get("hidden_test_result")
    if not isinstance(result, dict):
        raise ValueError(
            "SWE reward: extra_info.hidden_test_result is missing; run the "
            "task's hidden tests (verltool_jax.rollout.final_check."
            "run_hidden_tests) before scoring"
        )
    gt = ground_truth if isinstance(ground_truth, dict) else {}
    n = len(gt.get("fail_to_pass") or ()) + len(gt.get("pass_to_pass") or ())
    score = swe_reward_from_result(result, n)
    return RewardResult(
        score,
        score > 0,
        {
            "has_answer": True,
            "tests": {
                k: result.get(k) for k in ("passed", "failed", "errors", "exit_code", "timed_out")
            },
        },
    )
