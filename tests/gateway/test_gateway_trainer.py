"""The trainer trains through the gateway (``rollout.producer="gateway"``): one RL step of
the tiny_math smoke config on the JAX sampler, with a real agent program over HTTP
(``tests/gateway/recording_agent.py``). The trajectories trained on carry exactly the
tokens, logprobs and versions the program was served, every piece of an episode that a
break split is in its group with the episode's reward, and the reward is the
``gateway.reward="sum"`` rule: verifier + program."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from verltool_jax.algos.advantages import compute_advantages
from verltool_jax.cli import parse_command_line
from verltool_jax.rollout.trajectory import load_trajectories

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).parent / "recording_agent.py"


def test_one_rl_step_through_the_gateway(tmp_path, sampler_tokenizer):
    from verltool_jax.train.trainer import train

    log = tmp_path / "calls.jsonl"
    cfg = parse_command_line(
        [
            "--config",
            str(REPO / "configs/tiny_math.py") + ":smoke",
            f"--config.trainer.out_dir={tmp_path / 'run'}",
            "--config.logging.progress_bar=false",
            "--config.logging.dump_trajectories=true",
            "--config.sampler.backend=jax",
            "--config.sft.steps=0",
            "--config.trainer.steps=1",
            "--config.data.max_eval_examples=2",
            "--config.rollout.producer=gateway",
            f"--config.gateway.agent={AGENT}:two_calls",
            "--config.gateway.reward=sum",
        ]
    ).config
    cfg.gateway.agent_args = {"log": str(log)}
    result = train(cfg, echo=False)
    assert result.policy_version == 1

    calls = defaultdict(list)
    for line in log.read_text().splitlines():
        c = json.loads(line)
        calls[c["key"]].append(c)
    trained = load_trajectories(tmp_path / "run" / "trained" / "step_00001.jsonl")
    assert len({t.group_id for t in trained}) == 2  # trainer.batch_groups
    episodes = defaultdict(list)
    for t in trained:
        episodes[t.data["gateway_episode"]].append(t)
    assert len(episodes) == 4  # 2 groups x rollout.n_samples

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "run" / "init_model")
    for key, pieces in episodes.items():
        served = sorted(calls[key], key=lambda c: c["turn"])
        assert len(served) == 2
        # a rewritten reply breaks the episode into two samples, else it is one sequence
        assert len(pieces) == (2 if served[1]["rewrote"] else 1)
        assert [t.trajectory_id for t in pieces] == [key, f"{key}/1"][: len(pieces)]
        runs = []  # the sampled spans (loss mask 1) of the pieces, in order
        for t in pieces:
            t.check()
            mask = np.array(t.loss_mask)
            edges = np.flatnonzero(np.diff(np.r_[0, mask, 0]))
            for a, b in zip(edges[::2], edges[1::2]):
                runs.append(
                    (t.response_ids[a:b], t.logprobs[a:b], set(t.versions[a:b]), t.group_id)
                )
            assert all(v == -1 for v, m in zip(t.versions, t.loss_mask) if not m)
        assert len(runs) == 2
        for (ids, lps, versions, _), c in zip(runs, served):
            assert len(ids) == c["completion_tokens"] == len(c["tokens"])
            assert lps == c["logprobs"]  # the sampler's own numbers, not recomputed
            assert [tok.decode([i]) for i in ids] == c["tokens"]
            assert versions == {0} and c["version"] == "policy-v0"
        # the reward rule, the same for every piece of the episode
        for t in pieces:
            assert t.reward_info["program_reward"] == 0.25
            assert t.reward == t.reward_info["acc"] + 0.25
            assert t.reward == pieces[0].reward and t.group_id == pieces[0].group_id

    # each episode is counted once in its group's statistics (the trainer's estimator on
    # one row per episode), every piece trained with its episode's advantage
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "batch/size" in m)
    assert step["batch/size"] == len(trained)
    eps = list(episodes.values())
    adv = compute_advantages("grpo", [p[0].reward for p in eps], [p[0].group_id for p in eps])
    assert np.allclose(adv, 0.0)  # all rewards in a group equal with an untrained policy

    # resuming the finished run takes no step; its held-out evaluation still goes through
    # the agent program (2 problems x 2 calls), not the built-in loop
    before = len(log.read_text().splitlines())
    again = train(cfg, echo=False)
    assert again.policy_version == 1
    assert len(log.read_text().splitlines()) == before + 4
