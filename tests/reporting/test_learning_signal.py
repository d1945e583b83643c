"""Learning-signal diagnostics: no-signal fraction, non-zero advantages, pass-rate bins,
and the console warning after K steps in a row without signal."""

from __future__ import annotations

import numpy as np

from verltool_jax.algos.advantages import compute_advantages
from verltool_jax.reporting.learning_signal import (
    NoSignalWatch,
    pass_rate_histogram,
    signal_metrics,
)


def test_signal_metrics_by_hand():
    # four groups of 4: all failed, all solved, 1/4 solved, 3/4 solved
    correct = [0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0]
    rewards = [float(c) for c in correct]
    gids = [g for g in "aaaabbbbccccdddd"]
    adv = compute_advantages("grpo", np.array(rewards, np.float32), gids)
    m = signal_metrics(rewards, gids, correct, adv)
    assert m["signal/no_signal_frac"] == 0.5
    assert m["signal/zero_groups"] == 1 and m["signal/solved_groups"] == 1
    assert m["signal/groups"] == 4
    assert m["signal/nonzero_adv"] == 8  # the two mixed groups, every trajectory
    assert m["signal/pass_rate_0"] == 0.25 and m["signal/pass_rate_100"] == 0.25
    assert m["signal/pass_rate_0-25"] == 0.25 and m["signal/pass_rate_50-75"] == 0.25
    assert m["signal/pass_rate_25-50"] == 0.0 and m["signal/pass_rate_75-99"] == 0.0


def test_partial_credit_is_signal_but_not_a_pass():
    # rewards differ (partial credit) although nobody is correct: the group has signal
    m = signal_metrics([0.99, 0.5], ["g", "g"], [0, 0])
    assert m["signal/no_signal_frac"] == 0.0 and m["signal/zero_groups"] == 1


def test_histogram_bins_cover_every_rate_once():
    rates = np.linspace(0, 1, 101)
    h = pass_rate_histogram(rates)
    assert abs(sum(h.values()) - 1.0) < 1e-12
    assert h["0"] == 1 / 101 and h["100"] == 1 / 101


def test_watch_warns_after_k_steps_in_a_row_and_names_the_fixes():
    w = NoSignalWatch(steps=3, frac=0.5)
    hard = {"signal/no_signal_frac": 0.9, "signal/zero_groups": 7, "signal/solved_groups": 0}
    assert w.update(hard) is None and w.update(hard) is None
    assert w.update({"signal/no_signal_frac": 0.2}) is None  # the run is broken
    msgs = [w.update(hard) for _ in range(6)]
    assert msgs[:2] == [None, None] and msgs[3:5] == [None, None]
    for m in (msgs[2], msgs[5]):
        assert "too hard" in m
        for setting in ("rollout.n_samples", "rollout.temperature", "sft.steps", "passrate"):
            assert setting in m
    easy = {"signal/no_signal_frac": 1.0, "signal/zero_groups": 0, "signal/solved_groups": 8}
    w = NoSignalWatch(steps=1)
    assert "too easy" in w.update(easy)
    assert NoSignalWatch(steps=0).update(easy) is None  # off
