"""pass@k (the Codex paper's unbiased estimator) against brute-force enumeration, and the
per-test-set grouping of scored trajectories."""

from __future__ import annotations

import itertools
import math

import pytest

from verltool_jax.reporting.pass_at_k import format_set_table, pass_at_k, set_metrics
from verltool_jax.rollout.trajectory import Trajectory


@pytest.mark.parametrize(
    "n,c,k", [(n, c, k) for n in range(1, 7) for c in range(n + 1) for k in range(1, n + 1)]
)
def test_pass_at_k_equals_enumeration_over_k_subsets(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_large_n_is_stable_and_monotone():
    vals = [pass_at_k(200, 3, k) for k in (1, 10, 100)]
    assert vals[0] == pytest.approx(3 / 200)
    assert vals[0] < vals[1] < vals[2] < 1.0


@pytest.mark.parametrize(
    "n,c,k,err",
    [(4, 5, 1, ValueError), (4, 1, 0, ValueError), (4, 1, 5, ValueError), (4.0, 1, 1, TypeError)],
)
def test_pass_at_k_rejects_bad_input(n, c, k, err):
    with pytest.raises(err):
        pass_at_k(n, c, k)


def _traj(source, acc, calls=0, invalid=0, resp=3):
    t = Trajectory(trajectory_id="t", group_id="g", prompt_ids=[1], data={"data_source": source})
    t.reward_info = {"acc": acc}
    t.tool_calls, t.invalid_tool_calls = calls, invalid
    t.response_ids = list(range(resp))
    return t


def test_set_metrics_groups_by_data_source():
    groups = [
        [_traj("gsm8k", 1.0, calls=1), _traj("gsm8k", 0.0)],
        [_traj("gsm8k", 0.0, calls=2, invalid=1), _traj("gsm8k", 0.0)],
        [_traj("svamp", 1.0, resp=5), _traj("svamp", 1.0, resp=7)],
    ]
    m = set_metrics(groups, k=2)
    assert sorted(m) == ["gsm8k", "svamp"]
    g = m["gsm8k"]
    assert g["problems"] == 2 and g["samples"] == 4
    assert g["acc"] == pytest.approx(0.25)
    assert g["pass@2"] == pytest.approx(0.5)  # problem 1: 1 of 2 right; problem 2: 0
    assert g["tool_call_rate"] == pytest.approx(0.5)
    assert g["invalid_call_rate"] == pytest.approx(1 / 3)
    assert m["svamp"]["acc"] == 1.0 and m["svamp"]["response_len"] == 6.0
    table = format_set_table({"greedy": m})
    assert "gsm8k" in table and "svamp" in table and "pass@2=0.500" in table
