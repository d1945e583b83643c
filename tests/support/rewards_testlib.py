"""Reward functions that misbehave, for the timeout tests (imported by reward workers)."""

from __future__ import annotations

import signal
import time

from verltool_jax.rewards import RewardResult, register_reward


@register_reward("test_sleep")
def sleep_reward(text, ground_truth, extra_info):
    """Sleeps ``extra_info['sleep_s']`` (interruptible), then scores 1."""
    time.sleep(float(extra_info.get("sleep_s", 0)))
    return RewardResult(1.0, True, {"has_answer": True})


@register_reward("test_wedged")
def wedged_reward(text, ground_truth, extra_info):
    """Blocks SIGALRM, then sleeps: like a call stuck in C code, only a kill stops it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(float(extra_info.get("sleep_s", 60)))
    return RewardResult(1.0, True, {})


@register_reward("test_raises")
def raising_reward(text, ground_truth, extra_info):
    raise RuntimeError("broken verifier")


@register_reward("test_verify_then_sleep")
def verify_then_sleep_reward(text, ground_truth, extra_info):
    """A symbolic check (math-verify, which has its own alarms), then a long sleep."""
    from verltool_jax.rewards.math_reward import symbolic_equal

    symbolic_equal("x+1", "1+x")
    time.sleep(30)
    return RewardResult(1.0, True, {})
