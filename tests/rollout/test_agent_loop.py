"""The asynchronous agent loop with a real tool server and a scripted sampler.

The scripted sampler (``scripted_sampler.ScriptedSampler``) drives exact
scenarios; ``test_rollout_samplers.py`` runs the same loop with the real vLLM and JAX
samplers.
"""

import asyncio
import socket

import pytest
from support.rollout_fixtures import keyed_items
from support.scripted_sampler import ScriptedSampler

from tool_server.client import ToolClient
from verltool_jax.rollout.agent_loop import PromptItem, run_rollout
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.producer import RolloutProducer
from verltool_jax.rollout.queue import TrajectoryQueue
from verltool_jax.rollout.sync_baseline import run_rollout_sync

PROMPT = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"


def prompt_ids(tok, text=PROMPT):
    return tok.encode(text, add_special_tokens=False)


def rollout(tok, url, script, cfg, n_prompts=1, n_samples=1, queue=None, sampler=None, **client):
    sampler = sampler or ScriptedSampler(tok, script)

    items = [PromptItem(prompt_ids(tok), group_id=f"p{i}") for i in range(n_prompts)]

    async def go():
        async with ToolClient(url, **client) as c:
            if queue is None:
                return await run_rollout(items, n_samples, sampler, c, tok, cfg)
            return await RolloutProducer(
                keyed_items(items),
                n_samples=n_samples,
                sampler=sampler,
                tool_client=c,
                tokenizer=tok,
                cfg=cfg,
                queue=queue,
            ).run()

    return asyncio.run(go()), sampler


def test_two_turns_with_python_token_in_token_out(tok, tool_url):
    script = {0: "Let me compute. <python>print(6*7)</python>", 1: "<answer>42</answer>"}
    cfg = RolloutConfig(max_turns=3, max_response_tokens=256)
    groups, sampler = rollout(tok, tool_url, lambda rid, k: script[k], cfg)
    ((t,),) = groups
    t.check()
    assert (t.termination, t.num_turns, t.tool_calls, t.invalid_tool_calls) == ("eos", 2, 1, 0)
    assert t.observations[0].strip() == "42"
    assert t.actions == ["Let me compute. <python>print(6*7)</python>"]
    turn0 = sampler.encode_turn(script[0])
    turn1 = sampler.encode_turn(script[1]) + [tok.eos_token_id]
    obs_ids = tok.encode(cfg.obs_template.format(obs=t.observations[0]), add_special_tokens=False)
    # token-in/token-out: exactly the sampled ids, then the observation tokenized alone
    assert t.response_ids == turn0 + obs_ids + turn1
    # the sampled ids are not what re-tokenizing the text would give
    assert turn0 != tok.encode(tok.decode(turn0), add_special_tokens=False)
    # loss mask covers exactly the generated tokens; logprobs/versions follow
    assert t.loss_mask == [1] * len(turn0) + [0] * len(obs_ids) + [1] * len(turn1)
    assert t.logprobs[len(turn0) : len(turn0) + len(obs_ids)] == [0.0] * len(obs_ids)
    assert t.logprobs[: len(turn0)] == pytest.approx([-0.01 * (i + 1) for i in range(len(turn0))])
    assert t.versions == [0] * len(turn0) + [-1] * len(obs_ids) + [0] * len(turn1)
    # the second request's prompt is the prompt plus the response so far, ids unchanged
    (_, ids0, p0), (_, ids1, p1) = sampler.calls
    assert ids0 == t.prompt_ids and ids1 == t.prompt_ids + turn0 + obs_ids
    assert p0.stop == cfg.action_stop_strings and p1.max_tokens == 256 - len(turn0) - len(obs_ids)
    assert len(t.tool_latencies) == 1 and t.tool_latencies[0] > 0


def test_final_stop_string_ends_the_trajectory_at_the_answer(tok, tool_url):
    """A turn that closes the final answer stops there (the sampler is asked to stop on it)
    and ends the trajectory; without it the same model runs on into another action."""
    answer = "<solution>42</solution>"
    script = {
        0: "<python>print(6*7)</python>",
        1: answer + answer + "<python>1</python>",
        2: "done",
    }
    plain = RolloutConfig(max_turns=3, max_response_tokens=256)
    ((t0,),) = rollout(tok, tool_url, lambda rid, k: script[k], plain)[0]
    assert (t0.num_turns, t0.tool_calls) == (3, 2)  # ran on past its answer
    cfg = RolloutConfig(max_turns=3, max_response_tokens=256, final_stop_strings=("</solution>",))
    groups, sampler = rollout(tok, tool_url, lambda rid, k: script[k], cfg)
    ((t,),) = groups
    t.check()
    assert (t.termination, t.num_turns, t.tool_calls) == ("eos", 2, 1)
    assert tok.decode(t.response_ids).endswith(answer)
    assert sampler.calls[0][2].stop == cfg.action_stop_strings + ("</solution>",)
    with pytest.raises(ValueError, match="final_stop_strings"):
        RolloutConfig(final_stop_strings=("</python>",))  # both a tool call and the end
    with pytest.raises(ValueError, match="final_stop_strings"):
        RolloutConfig(final_stop_strings="</solution>")
    assert RolloutConfig.from_mapping({"final_stop_strings": ["</answer>"]}).final_stop_strings == (
        "</answer>",
    )


def test_observation_truncated_in_tokens(tok, tool_url):
    script = {0: "<python>print('ab ' * 500)</python>", 1: "done"}
    for side in ("head", "tail"):
        cfg = RolloutConfig(
            max_turns=2,
            max_response_tokens=512,
            max_obs_tokens=20,
            obs_truncate_side=side,
            obs_truncate_marker="[cut]",
            obs_template="<result>{obs}</result>",
        )
        ((t,),) = rollout(tok, tool_url, lambda rid, k: script[k], cfg)[0]
        assert t.obs_truncated == 1
        obs_ids = [i for i, m in zip(t.response_ids, t.loss_mask) if m == 0]
        start, end = tok.convert_tokens_to_ids("<result>"), tok.convert_tokens_to_ids("</result>")
        assert obs_ids[0] == start and obs_ids[-1] == end and len(obs_ids) == 22
        marker = tok.encode("[cut]", add_special_tokens=False)
        full = tok.encode(t.observations[0], add_special_tokens=False)
        body = obs_ids[1:-1]
        if side == "head":
            assert body == full[: 20 - len(marker)] + marker
        else:
            assert body == marker + full[-(20 - len(marker)) :]


def test_turn_limit(tok, tool_url):
    cfg = RolloutConfig(max_turns=2, max_response_tokens=1024)
    ((t,),) = rollout(tok, tool_url, lambda rid, k: f"<python>print({k})</python>", cfg)[0]
    assert (t.termination, t.tool_calls, t.num_turns) == ("max_turns", 2, 3)
    assert [o.strip() for o in t.observations] == ["0", "1"]


def test_response_budget(tok, tool_url):
    cfg = RolloutConfig(max_turns=10, max_response_tokens=60)
    ((t,),) = rollout(tok, tool_url, lambda rid, k: f"<python>print({k} + 1000)</python>", cfg)[0]
    assert t.termination == "budget"
    assert len(t.response_ids) <= 60 and t.tool_calls >= 1
    t.check()


def test_tool_timeout_ends_turn_with_observation_not_batch(tok, slow_tool_url):
    # server side: the tool's 1 s limit cuts the ~3 s search; client side: a 0.5 s limit.
    script = lambda rid, k: "<search>slow</search>" if k == 0 else "ok"
    cfg = RolloutConfig(max_turns=2, max_response_tokens=256)
    for client_timeout in (30.0, 0.5):
        ((t,),) = rollout(tok, slow_tool_url, script, cfg, timeout_s=client_timeout)[0]
        assert t.termination == "eos" and t.num_turns == 2, t.error
        assert t.tool_calls == 1 and t.invalid_tool_calls == 1
        assert "time" in t.observations[0].lower()
        assert t.tool_latencies[0] < 2.5


def test_errors_end_only_their_trajectory(tok, tool_url):
    def script(rid, k):
        if rid == "p0-1" and k == 1:
            raise RuntimeError("engine died")
        return "<python>print(1)</python>" if k == 0 else "bye"

    cfg = RolloutConfig(max_turns=2, max_response_tokens=256)
    (g,), _ = rollout(tok, tool_url, script, cfg, n_samples=3)
    by = {t.trajectory_id: t for t in g}
    assert by["p0-1"].termination == "error" and "engine died" in by["p0-1"].error
    assert by["p0-0"].termination == by["p0-2"].termination == "eos"
    # tool server down: every trajectory ends with an error, the rollout still returns
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    (g,), _ = rollout(
        tok,
        dead,
        lambda rid, k: "<python>print(1)</python>",
        cfg,
        n_samples=2,
        retries=1,
        backoff_s=0.01,
    )
    assert [t.termination for t in g] == ["error", "error"]
    assert all("unreachable" in t.error for t in g)


def test_sync_baseline_produces_the_same_records(tok, tool_url):
    def script(rid, k):
        n = int(rid.split("-")[1])
        return f"<python>print({n} * {k})</python>" if k < n else "end"

    cfg = RolloutConfig(max_turns=4, max_response_tokens=512)
    (ga,), _ = rollout(tok, tool_url, script, cfg, n_samples=4)

    async def go():
        async with ToolClient(tool_url) as c:
            return await run_rollout_sync(
                [PromptItem(prompt_ids(tok), group_id="p0")],
                4,
                ScriptedSampler(tok, script),
                c,
                tok,
                cfg,
            )

    (gs,) = asyncio.run(go())
    for a, s in zip(ga, gs):
        assert a.trajectory_id == s.trajectory_id
        assert (a.response_ids, a.loss_mask, a.logprobs, a.num_turns, a.termination) == (
            s.response_ids,
            s.loss_mask,
            s.logprobs,
            s.num_turns,
            s.termination,
        )
    assert [t.tool_calls for t in gs] == [0, 1, 2, 3]


def test_thousand_concurrent_trajectories_none_lost_or_duplicated(tok, tool_url):
    def script(rid, k):
        return f"<search>{rid}</search>" if k < 2 else "fin"

    cfg = RolloutConfig(max_turns=3, max_response_tokens=512, max_obs_tokens=64)
    sampler = ScriptedSampler(tok, script, canonical=True, delay_s=0.001)
    q = TrajectoryQueue(max_groups=1000, group_size=8)
    groups, _ = rollout(
        tok,
        tool_url,
        script,
        cfg,
        n_prompts=125,
        n_samples=8,
        queue=q,
        sampler=sampler,
        max_connections=64,
    )
    trajs = [t for g in groups for t in g]
    ids = [t.trajectory_id for t in trajs]
    assert len(ids) == 1000 and len(set(ids)) == 1000
    assert q.depth() == 125 and q.metrics.trajectories_in == 1000
    for t in trajs:
        assert t.termination == "eos" and t.tool_calls == 2, (t.trajectory_id, t.error)
        # every observation answers this trajectory's own query: no cross-talk
        assert all(t.trajectory_id in o for o in t.observations), t.observations


def test_rollout_feeds_a_trainer_on_policy_and_drops_stale_groups(tok, tool_url):
    def script(rid, k):
        return "<python>print(2)</python>" if k == 0 else "ok"

    cfg = RolloutConfig(max_turns=2, max_response_tokens=128)
    sampler = ScriptedSampler(tok, script, delay_s=0.01)
    q = TrajectoryQueue(max_groups=8, max_staleness=0, groups_per_batch=2)
    seen = []

    async def trainer():
        for step in range(3):
            batch = await q.get_batch(2, timeout=60)
            seen.append([t.min_version for g in batch for t in g])
            sampler.update_weights(None, step + 1)  # new weights, then a new version
            await q.set_version(step + 1)

    async def go():
        async with ToolClient(tool_url) as c:
            producer = RolloutProducer(
                keyed_items([PromptItem(prompt_ids(tok), group_id=f"p{i}") for i in range(6)]),
                n_samples=2,
                sampler=sampler,
                tool_client=c,
                tokenizer=tok,
                cfg=cfg,
                queue=q,
            )
            await asyncio.gather(trainer(), producer.run())

    asyncio.run(go())
    # max_staleness=0: every batch was sampled entirely by the trainer's current version
    assert seen == [[0] * 4, [1] * 4, [2] * 4]
    assert q.metrics.dropped_stale == 0 and q.metrics.groups_out == 6

    # groups sampled at version 0 are dropped once the trainer is 2 versions ahead
    q2 = TrajectoryQueue(max_groups=8, max_staleness=1)
    groups, _ = rollout(tok, tool_url, script, cfg, n_prompts=2, n_samples=2, queue=q2)
    assert q2.depth() == 2

    async def advance():
        await q2.set_version(2)

    asyncio.run(advance())
    assert q2.depth() == 0 and q2.metrics.dropped_stale == 2


def test_data_row_extra_info_reaches_the_tool(tok, tool_url, tmp_path):
    import sqlite3

    db = tmp_path / "t.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE city (name TEXT, pop INTEGER)")
        con.execute("INSERT INTO city VALUES ('Oslo', 709000)")
    script = {0: "<sql>SELECT pop FROM city WHERE name = 'Oslo';</sql>", 1: "end"}
    cfg = RolloutConfig(max_turns=2, max_response_tokens=256)

    async def go():
        async with ToolClient(tool_url) as c:
            return await run_rollout(
                [{"prompt_ids": prompt_ids(tok), "data": {"extra_info": {"db_path": str(db)}}}],
                1,
                ScriptedSampler(tok, lambda rid, k: script[k]),
                c,
                tok,
                cfg,
            )

    ((t,),) = asyncio.run(go())
    assert t.tool_calls == 1 and t.invalid_tool_calls == 0, t.observations
    assert "709000" in t.observations[0]
