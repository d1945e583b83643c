"""Resume keeps half-finished work: a real run (tiny_math smoke config, the real trainer,
its tool server with a stateful python) is interrupted at its last checkpoint while
trajectories are in the middle of generation and of a tool call; the resumed run goes on
with them (same group and trajectory ids, the saved tokens, logprobs and versions as the
prefix of what it trains on), the one cut in its tool call is told that its python state
was reset, and the data accounting is exact: every prompt trained once.

The sampler is scripted (the turns must call the tool at known moments; an untrained
tiny model rarely does): turn 1 sets a variable, turn 2 prints it (slowly in one
trajectory of each group), turn 3 answers."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from support.scripted_sampler import ScriptedSampler
from support.smoke_run import smoke_train_flags

from verltool_jax.cli import parse_command_line
from verltool_jax.rollout.trajectory import load_trajectories
from verltool_jax.train import build
from verltool_jax.train import trainer as trainer_mod

SLOW = "import time; time.sleep(3); "


def _config(out: Path, steps: int):
    flags = smoke_train_flags(out, steps) + [
        "--config.rollout.max_response_tokens=120",
        "--config.logging.dump_trajectories=true",
    ]
    config = parse_command_line(flags).config
    with config.unlocked():  # one interpreter a trajectory
        config.tool_server.tool_opt["python_stateful"] = "true"
    return config


def make_sampler(rc, model_dir, *, trainer_overlaps=None, adapters=True):
    tok = build.load_tokenizer(rc, model_dir)

    def script(rid: str, turn: int) -> str:
        # the turn from the context (a resumed trajectory's counter starts afresh here):
        # the system prompt shows the tag once, each earlier action adds one
        n = tok.decode(sampler.calls[-1][1]).count("</python>") - 1
        if n == 0:
            return "<python>v = 7</python>"
        if n == 1:
            return f"<python>{SLOW if rid.endswith('-0') else ''}print(v)</python>"
        return "<answer>7</answer>"

    sampler = ScriptedSampler(tok, script, canonical=True, delay_s=0.3)
    return sampler


def _open_slots(loop):
    groups = loop.deps.producer.in_flight.groups.values()
    return [s for g in groups for s in g if not s.done and not s.builder.finished]


def _checkpoint_data(out: Path, step: int) -> dict:
    return json.loads((out / "checkpoints" / str(step) / "data" / "metadata").read_text())


def _trained(out: Path) -> dict:
    trajs = [
        t for p in sorted((out / "trained").glob("step_*.jsonl")) for t in load_trajectories(p)
    ]
    return {t.trajectory_id: t for t in trajs}


@pytest.mark.slow  # ~5 min on 2 busy cores: two runs (tests/rollout/test_inflight.py: fast)
def test_a_resume_goes_on_with_the_trajectories_in_flight(tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(build, "make_sampler", make_sampler)
    save = trainer_mod.RLLoop.evaluate_and_checkpoint

    async def at_a_chosen_moment(self):
        """The last step's checkpoint waits (the rollout goes on) until one trajectory is
        in a tool call and another in generation, then saves; the run then ends."""
        if self.version == 2:
            for _ in range(600):
                slots = _open_slots(self)
                calling = [s for s in slots if s.builder.pending_action is not None]
                if any(s.builder.traj.tool_calls for s in calling) and len(calling) < len(slots):
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("no trajectory came to a tool call in 12 s")
        await save(self)

    monkeypatch.setattr(trainer_mod.RLLoop, "evaluate_and_checkpoint", at_a_chosen_moment)
    first = trainer_mod.train(_config(out, steps=2), echo=False).summary.data
    assert first["ok"] and first["trained"] == 4, first

    saved = _checkpoint_data(out, 2)
    records = {r["gid"]: r for r in saved["rollouts"]}
    flight = {serial for serial, _ in saved["replay"]}
    assert {r["serial"] for r in records.values()} <= flight
    trajs = {
        t["trajectory"]["trajectory_id"]: t for r in records.values() for t in r["trajectories"]
    }
    calling = [tid for tid, t in trajs.items() if t["pending_action"]]
    generating = [
        tid
        for tid, t in trajs.items()
        if not t["done"] and not t["pending_action"] and not t["trajectory"]["termination"]
    ]
    assert generating and any(trajs[tid]["trajectory"]["tool_calls"] for tid in calling), trajs

    monkeypatch.setattr(trainer_mod.RLLoop, "evaluate_and_checkpoint", save)
    # two groups a step: by step 5 every prompt in flight at the checkpoint is trained
    second = trainer_mod.train(_config(out, steps=5), echo=False).summary.data
    assert second["ok"] and second["trained"] == 10 and not second["lost"], second

    trained = _trained(out)
    # every prompt trained once: no data row twice (the 32-row stream does not wrap)
    rows = [re.fullmatch(r"[sr]\d+-(\d+)(\.a\d+)?", t.group_id) for t in trained.values()]
    per_group = {t.group_id: m.group(1) for t, m in zip(trained.values(), rows) if m}
    assert len(per_group) == 10 and len(set(per_group.values())) == 10, per_group
    # the saved groups were gone on with, under their ids, not sampled again
    assert set(records) <= set(per_group), (sorted(records), sorted(per_group))
    for gid in records:
        for t in records[gid]["trajectories"]:
            before, after = t["trajectory"], trained[t["trajectory"]["trajectory_id"]]
            n = len(before["response_ids"])
            for key in ("response_ids", "logprobs", "versions", "loss_mask"):
                assert getattr(after, key)[:n] == before[key], key
            assert after.observations[: len(before["observations"])] == before["observations"]
            if t["done"]:
                assert after.response_ids == before["response_ids"]
    # the trajectory cut in its tool call sent it again, and was told its state is gone
    told = [tid for tid in calling if trajs[tid]["trajectory"]["tool_calls"]]
    for tid in told:
        obs = trained[tid].observations[trajs[tid]["trajectory"]["tool_calls"]]
        assert obs.startswith("[tool state was reset") and "python_code" in obs, obs
        assert "NameError" in obs  # ``v`` went with the interpreter
