"""Trajectories in flight across a checkpoint, at the rollout level (a real tool server
with per-trajectory python interpreters, a scripted sampler): a producer stopped while one
trajectory is in a slow tool call and another in generation saves both; a producer over
the restored ledger goes on with them. The server that kept the generating one's
interpreter (same calls as its record) keeps it; the one cut in its call had run one
call more than its record, so its state is reset and it is told so."""

import asyncio
import json
import time

from support.rollout_fixtures import keyed_items
from support.scripted_sampler import ScriptedSampler

from tool_server.client import ToolClient
from verltool_jax.rollout.agent_loop import PromptItem
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.ledger import PromptLedger
from verltool_jax.rollout.producer import RolloutProducer
from verltool_jax.rollout.queue import TrajectoryQueue

PROMPT = "<|im_start|>user\nWhat is 6 + 1?<|im_end|>\n<|im_start|>assistant\n"
TURNS = {  # by trajectory (-0, -1), by the number of actions so far
    "0": ["<python>v = 7</python>", "<python>import time; time.sleep(4); print(v)</python>"],
    "1": ["<python>v = 7</python>", "<python>print(v)</python>", "<python>print(v + 1)</python>"],
}


class Sampler(ScriptedSampler):
    """Turns from ``TURNS``; the second trajectory generates slowly (1.5 s a turn), so it
    is generating while the first one is in its slow call."""

    async def generate(self, prompt_token_ids, params, request_id=None):
        if request_id.endswith("-1"):
            await asyncio.sleep(1.5)
        return await super().generate(prompt_token_ids, params, request_id)


def make_sampler(tok):
    def script(rid: str, turn: int) -> str:
        n = tok.decode(sampler.calls[-1][1]).count("</python>")  # from the context
        turns = TURNS[rid[-1]]
        return turns[n] if n < len(turns) else "<answer>7</answer>"

    sampler = Sampler(tok, script, canonical=True, delay_s=0.1)
    return sampler


def test_a_restored_producer_goes_on_with_the_trajectories_in_flight(tok, tool_url):
    cfg = RolloutConfig(max_turns=3, max_response_tokens=1024, action_stop_strings=("</python>",))
    item = PromptItem(
        tok.encode(PROMPT, add_special_tokens=False),
        {"extra_fields": {"stateful": True}},  # the python tool keeps an interpreter
        group_id="s1-0",
    )

    def producer(client, ledger=None, items=()):
        kw = dict(sampler=make_sampler(tok), tool_client=client, tokenizer=tok, cfg=cfg)
        queue = TrajectoryQueue(max_groups=4, max_staleness=1)
        return RolloutProducer(keyed_items(items), n_samples=2, queue=queue, ledger=ledger, **kw)

    async def first() -> dict:
        async with ToolClient(tool_url) as client:
            p = producer(client, items=[item])
            task = asyncio.create_task(p.run())
            calling_since = None
            for _ in range(2000):
                await asyncio.sleep(0.01)
                a, b = p.in_flight.groups.get("s1-0", [None, None])
                if a is None or a.done or b.done:
                    continue
                if a.builder.pending_action and a.builder.traj.tool_calls == 1:
                    calling_since = calling_since or time.monotonic()
                # the slow call reached the server (0.5 s ago); b generates after a call
                if (
                    calling_since
                    and time.monotonic() - calling_since > 0.5
                    and b.builder.traj.tool_calls in (1, 2)
                    and not b.builder.pending_action
                ):
                    break
            else:
                raise AssertionError("never one trajectory in a call and one generating")
            saved = json.loads(json.dumps(p.data_state()))  # a checkpoint's JSON
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return saved

    saved = asyncio.run(first())
    (record,) = saved["rollouts"]
    t0, t1 = (r["trajectory"] for r in record["trajectories"])
    assert record["trajectories"][0]["pending_action"].endswith("print(v)</python>")
    assert t0["tool_calls"] == 1 and t1["tool_calls"] in (1, 2) and record["gid"] == "s1-0"

    async def second():
        async with ToolClient(tool_url) as client:
            ledger = PromptLedger.restore(saved, lambda key, serial: item)
            return await producer(client, ledger).run(), ledger

    (group,), ledger = asyncio.run(second())
    assert [t.trajectory_id for t in group] == ["s1-0-0", "s1-0-1"]
    for t, before in zip(group, (t0, t1)):
        n = len(before["response_ids"])
        assert t.response_ids[:n] == before["response_ids"] and t.termination == "eos"
        assert t.logprobs[:n] == before["logprobs"] and t.versions[:n] == before["versions"]
        assert t.observations[: before["tool_calls"]] == before["observations"]
    reset, kept = group[0].observations[1], group[1].observations[2]
    assert reset.startswith("[tool state was reset") and "NameError" in reset, reset
    assert kept.strip() == "8"  # the interpreter the server kept: v is still 7
    ledger.end([group], "trained")
    assert ledger.report().ok


def test_a_group_with_observation_images_is_not_kept():
    from verltool_jax.rollout.inflight import snapshot
    from verltool_jax.rollout.ledger import Entry
    from verltool_jax.rollout.trajectory import Trajectory, TrajectoryImage

    def group(gid, source):
        images = [TrajectoryImage(None, 1, source, 0 if source == "prompt" else 1)]
        return [Trajectory(f"{gid}-0", gid, [1, 2], images=images)]

    entries = {g: Entry(i, i, PromptItem([1, 2], group_id=g)) for i, g in enumerate("ab")}
    kept = snapshot({}, [group("a", "prompt"), group("b", "observation")], entries)
    assert [r["gid"] for r in kept] == ["a"]  # b is sampled again from its prompt
    assert snapshot({}, [group("c", "prompt")], entries) == []  # not in flight: not kept
