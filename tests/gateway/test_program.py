"""The trainer's side of the gateway (``verltool_jax/gateway/program.py``): the reward
rule, the agent program's loading, and an episode split by a break counted once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from verltool_jax.algos.advantages import compute_advantages, episode_advantages
from verltool_jax.gateway.program import bind_agent, combine_reward, load_agent
from verltool_jax.rewards.compute import RewardPool, score_episodes
from verltool_jax.rollout.trajectory import Trajectory


def test_reward_rules():
    assert combine_reward("verifier", 1.0, 0.3) == 1.0
    assert combine_reward("program", 1.0, 0.3) == 0.3
    assert combine_reward("program", 1.0, None) is None
    assert combine_reward("sum", 1.0, 0.3) == pytest.approx(1.3)
    assert combine_reward("sum", 1.0, None) == 1.0
    with pytest.raises(ValueError, match="gateway.reward"):
        combine_reward("mean", 1.0, 0.3)


def test_a_split_episode_counts_once_in_its_group():
    # group g: episodes a (reward 1, split in 2 pieces), b (0), c (0)
    rewards = [1.0, 1.0, 0.0, 0.0]
    gids = ["g", "g", "g", "g"]
    eids = ["a", "a", "b", "c"]
    adv = episode_advantages("grpo", rewards, gids, eids)
    once = compute_advantages("grpo", [1.0, 0.0, 0.0], ["g", "g", "g"])
    np.testing.assert_allclose(adv, [once[0], once[0], once[1], once[2]], rtol=1e-6)
    # counting pieces instead would give a different (wrong) baseline
    assert not np.allclose(adv, compute_advantages("grpo", rewards, gids))
    # one row per episode: the estimator itself
    np.testing.assert_array_equal(
        episode_advantages("rloo", [1.0, 0.0], gids[:2], ["x", "y"]),
        compute_advantages("rloo", [1.0, 0.0], gids[:2]),
    )
    with pytest.raises(ValueError, match="share its group id"):
        episode_advantages("grpo", rewards, ["g", "h", "g", "g"], eids)


def test_agent_programs_load_by_module_or_file(tmp_path):
    f = tmp_path / "prog.py"
    f.write_text("async def run(base_url, data, tool_url, k=1):\n    return (tool_url, k)\n")
    fn = bind_agent(load_agent(f"{f}:run"), "http://tools", {"k": 2})
    assert asyncio.run(fn("http://gw/t/x/v1", {})) == ("http://tools", 2)
    assert load_agent("json:dumps") is not None
    for spec, msg in [
        ("nocolon", "must be 'module:function'"),
        ("no_such_module_xyz:f", "cannot load"),
        ("json:no_such_fn", "has no function"),
        (f"{tmp_path}/missing.py:f", "cannot load"),
    ]:
        with pytest.raises(ValueError, match=f"gateway.agent=.*{msg}"):
            load_agent(spec)


def _traj(tid, gid, episode, text_ids, program=None):
    data = {
        "data_source": "tiny_math",
        "reward_model": {"style": "rule", "ground_truth": "42"},
        "gateway_episode": episode,
    }
    info = {} if program is None else {"program_reward": program}
    return Trajectory(
        tid, gid, [1], response_ids=list(text_ids), loss_mask=[1] * len(text_ids),
        logprobs=[0.0] * len(text_ids), versions=[0] * len(text_ids), termination="done",
        data=data, reward_info=info,
    )  # fmt: skip


def test_an_episode_is_scored_once_on_all_its_pieces(sampler_tokenizer):
    tok = sampler_tokenizer
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    # episode e1: the answer is in its second piece; e2: one piece, wrong
    trajs = [
        _traj("e1", "g", "e1", ids("let me compute"), program=0.5),
        _traj("e1/1", "g", "e1", ids("<answer>42</answer>"), program=0.5),
        _traj("e2", "g", "e2", ids("<answer>41</answer>"), program=0.5),
    ]
    with RewardPool(num_workers=0) as pool:
        asyncio.run(score_episodes(pool, trajs, tok, "sum"))
        assert [t.reward for t in trajs] == [1.5, 1.5, 0.5]
        assert [t.reward_info["acc"] for t in trajs] == [1.0, 1.0, 0.0]
        assert all(t.reward_info["program_reward"] == 0.5 for t in trajs)
        # our agent loop's trajectories (no gateway_episode): each scored on its own
        own = [_traj("t1", "g", None, ids("<answer>42</answer>")),
               _traj("t2", "g", None, ids("<answer>7</answer>"))]  # fmt: skip
        for t in own:
            t.data.pop("gateway_episode")
        asyncio.run(score_episodes(pool, own, tok, "verifier"))
        assert [t.reward for t in own] == [1.0, 0.0]
        no_program = [_traj("e3", "g", "e3", ids("<answer>42</answer>"))]
        asyncio.run(score_episodes(pool, no_program, tok, "program"))
        assert no_program[0].termination == "error" and "gave none" in no_program[0].error
