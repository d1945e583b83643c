"""Partial rollouts on the rollout side: a turn continued across a weight sync records the
version of each token, and staleness counts the oldest token's version."""

import pytest

from verltool_jax.rollout.agent_loop import make_formatter
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.queue import TrajectoryQueue, staleness
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.rollout.turns import TrajectoryBuilder
from verltool_jax.samplers.base import Completion


def builder(tok, cfg):
    return TrajectoryBuilder("t-0", "t", [1, 2, 3], cfg, tok, make_formatter(tok, cfg))


def test_a_turn_continued_across_a_sync_records_each_tokens_version(tok):
    from tool_server.client import ToolResult

    cfg = RolloutConfig(max_turns=2, max_response_tokens=64, action_stop_strings=("</python>",))
    b = builder(tok, cfg)
    act = tok.encode("<python>print(1)</python>", add_special_tokens=False)
    # the first turn was cut by the sync to version 4 after 3 tokens
    comp = Completion(
        act,
        [-0.1] * len(act),
        "stop",
        "</python>",
        policy_version=3,
        token_versions=[3, 3, 3] + [4] * (len(act) - 3),
    )
    assert b.apply_completion(comp) is not None
    b.apply_observation(ToolResult("1", done=False, valid=True, latency_s=0.0))
    tail = tok.encode("done", add_special_tokens=False) + [tok.eos_token_id]
    assert b.apply_completion(Completion(tail, [-0.2] * len(tail), "stop", None, 5)) is None
    t = b.traj
    t.check()
    n_obs = len(t.response_ids) - len(act) - len(tail)
    assert t.versions == [3, 3, 3] + [4] * (len(act) - 3) + [-1] * n_obs + [5] * len(tail)
    assert t.min_version == 3  # the oldest token's
    assert staleness(6, [t]) == 3


def test_completion_versions_default_and_mismatch():
    assert Completion([7, 8], [0.0, 0.0], "stop", policy_version=2).versions() == [2, 2]
    c = Completion([7, 8], [0.0, 0.0], "stop", policy_version=2, token_versions=[2])
    with pytest.raises(ValueError, match="token_versions has 1 entries for 2 tokens"):
        c.versions()


def _traj(gid, versions):
    n = len(versions)
    return Trajectory(f"{gid}-0", gid, [1], [5] * n, [1] * n, [0.0] * n, list(versions))


async def test_admission_drops_by_the_oldest_token_not_the_newest():
    """A group whose last tokens are fresh but whose first token is too old is dropped;
    one whose every token is within the bound is kept."""
    q = TrajectoryQueue(max_groups=8, max_staleness=1)
    await q.put_group([_traj("mixed_old", [0, 0, 2, 2])])  # continued from version 0 to 2
    await q.put_group([_traj("mixed_ok", [1, 2, 2])])
    await q.set_version(2)
    (g,) = await q.get_batch(1, timeout=1)
    assert g[0].group_id == "mixed_ok"
    assert q.metrics.dropped_stale == 1
    assert [grp[0].group_id for grp in q.take_dropped()] == ["mixed_old"]
