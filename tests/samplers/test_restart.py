"""The restart budget of dead sampler engines (samplers/restart.py): bounded within a
window, exponential backoff reset by a served request."""

from __future__ import annotations

import pytest

from verltool_jax.samplers.restart import RestartBudget, backoff_delay


def test_backoff_doubles_up_to_the_cap():
    assert [backoff_delay(k, 0.5, 3.0) for k in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_delay(0, 0.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="attempt"):
        backoff_delay(-1, 1.0, 2.0)


def test_budget_bounds_restarts_within_the_window_not_over_the_run():
    now = [0.0]
    b = RestartBudget(max_restarts=2, window_s=100.0, backoff_s=1.0, clock=lambda: now[0])
    assert b.next_delay() == 1.0
    b.record()
    assert b.next_delay() == 2.0  # the restart failed: back off longer
    b.record()
    assert b.next_delay() is None and b.in_window() == 2  # repeated failure: spent
    assert "2 restarts within 100 s (max_restarts=2" in b.spent()
    now[0] = 50.0
    assert b.next_delay() is None
    now[0] = 100.0  # both restarts left the window: an occasional death is restarted
    b.served()
    assert b.next_delay() == 1.0 and b.total == 2 and b.in_window() == 0


def test_budget_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_restarts >= 0"):
        RestartBudget(max_restarts=-1)
    with pytest.raises(ValueError, match="window_s"):
        RestartBudget(window_s=0)
    assert RestartBudget(max_restarts=0).next_delay() is None


def test_wait_or_raise_counts_a_restart_or_raises_the_samplers_error_from_the_cause():
    b = RestartBudget(max_restarts=2, window_s=100.0, backoff_s=1.0, clock=lambda: 0.0)

    def dead(cause, why):
        return RuntimeError(f"engine died ({cause}) after {why}")

    assert [b.wait_or_raise(OSError("gone"), dead) for _ in range(2)] == [1.0, 2.0]
    assert b.total == 2
    with pytest.raises(RuntimeError, match=r"died \(start failed\) after 2 restarts") as e:
        b.wait_or_raise(OSError("start failed"), dead)
    assert isinstance(e.value.__cause__, OSError) and b.total == 2
