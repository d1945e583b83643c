"""Trajectories in flight across a checkpoint: what a resumed run continues instead of
sampling their prompts again.

The producer registers every group it rolls out (:class:`InFlight`) until the group is in
the queue. A checkpoint (:func:`snapshot`) saves, for every group whose prompt is in
flight in the ledger, each trajectory as far as it went: its tokens, loss mask, the
sampler's logprobs and the policy version of each token, its turns, tool calls,
observations and the observations' payloads (``extras``, images left out), whether it
ended, and the action it sent to the tool server and has no answer for yet (a turn in
the middle of a tool call). Groups waiting complete in the queue are saved the same way.
A turn in the middle of generation is saved without its unfinished tokens: the resumed
run samples that turn again from the same prefix (a fresh sample of the policy it has
then; each token keeps the version that sampled it, so staleness and the off-policy
correction stay exact).

On resume (:func:`restore_group`), a group whose prompt still tokenizes to the same ids
gets back its group id and trajectory ids; its unfinished trajectories go on where they
stopped, the pending action is sent again (at least once), and the first tool call
carries the trajectory's earlier actions (``tool_server.protocol.RESUMED_FIELD``): a
server that no longer holds the state they built says so in the observation ("tool
state was reset", ``tool_server.dispatcher.RESET_NOTE``). Not saved, so rolled out again
from the prompt as before (``PromptLedger``): a group with observation images (the
images are not kept), a group rolling out in a native tool-call format with a trajectory
not yet ended (its conversation is not kept), a group taken by a step that was cut
short, a group dropped as stale, and the groups of a gateway producer (an agent
program's state is its own).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from tool_server.protocol import RESUMED_FIELD
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.rollout.turns import TrajectoryBuilder

IMAGE_KEYS = ("image", "images")  # payload keys not saved (data URLs)


@dataclass
class Slot:
    """One trajectory of a group in flight: its builder, and whether its rollout ended
    (final check and finish included)."""

    builder: TrajectoryBuilder
    done: bool = False


class InFlight:
    """The groups a producer is rolling out, by group id (registered when they start,
    removed once in the queue)."""

    def __init__(self) -> None:
        self.groups: dict[str, list[Slot]] = {}

    def add(self, gid: str, slots: list[Slot]) -> None:
        self.groups[gid] = slots

    def remove(self, gid: str) -> None:
        self.groups.pop(gid, None)


def _extras(extras: list[dict]) -> list[dict]:
    out = [{k: v for k, v in e.items() if k not in IMAGE_KEYS} for e in extras]
    return json.loads(json.dumps(out, default=str))


def trajectory_record(t: Trajectory, done: bool, pending_action: str | None) -> dict:
    """One trajectory as a checkpoint keeps it (JSON; the prompt ids are the group's)."""
    rec = t.to_json()
    del rec["prompt_ids"]
    rec["extras"] = _extras(t.extras)
    return {"done": done, "pending_action": pending_action, "trajectory": rec}


def resumable(group: Iterable[Trajectory]) -> bool:
    """False for a group a checkpoint cannot keep: one with observation images."""
    return not any(im.source != "prompt" for t in group for im in t.images)


def snapshot(
    live: Mapping[str, list[Slot]],
    waiting: Iterable[list[Trajectory]],
    entries: Mapping[str, Any],
) -> list[dict]:
    """The records of the groups in flight: ``live`` (rolling out) and ``waiting`` (complete,
    in the queue), each kept only if its group id is one of ``entries`` (the ledger's
    draws in flight, ``ledger.Entry`` by group id) and :func:`resumable`. Each record:
    ``serial``, ``gid``, ``base_gid``, ``attempt`` (the ledger's), ``prompt_ids`` and
    ``trajectories`` (:func:`trajectory_record`)."""
    groups: dict[str, list[tuple[Trajectory, bool, str | None]]] = {}
    for g in waiting:
        if g and resumable(g):
            groups[g[0].group_id] = [(t, True, None) for t in g]
    for gid, slots in live.items():
        # a native-format trajectory's conversation is not saved: rolled out again
        midway = any(s.builder.native is not None and not s.builder.finished for s in slots)
        if resumable(s.builder.traj for s in slots) and not midway:
            groups[gid] = [(s.builder.traj, s.done, s.builder.pending_action) for s in slots]
    out = []
    for gid, trajs in sorted(groups.items()):
        e = entries.get(gid)
        if e is None:
            continue
        out.append(
            {
                "serial": e.serial,
                "gid": gid,
                "base_gid": e.base_gid,
                "attempt": e.attempt,
                "prompt_ids": list(trajs[0][0].prompt_ids),
                "trajectories": [trajectory_record(*x) for x in trajs],
            }
        )
    return out


def restore_group(record: dict, make_builder: Any) -> list[Slot]:
    """The slots of a saved group: ``make_builder(trajectory_id)`` makes a fresh
    :class:`TrajectoryBuilder` for the group's prompt (its images included), whose
    trajectory then takes the saved record's fields; an unfinished one with earlier tool
    calls tells the tool server on its next call (``RESUMED_FIELD``)."""
    slots = []
    for saved in record["trajectories"]:
        rec = copy.deepcopy(saved["trajectory"])  # the record stays as saved
        b: TrajectoryBuilder = make_builder(rec["trajectory_id"])
        fresh = b.traj
        known = {f.name for f in fields(Trajectory)}  # a field a later version dropped: left out
        rec = {k: v for k, v in rec.items() if k in known}
        b.traj = Trajectory.from_json(
            {**rec, "prompt_ids": list(fresh.prompt_ids), "data": rec.get("data", fresh.data)}
        )
        b.traj.images, b.traj.image_token_id = fresh.images, fresh.image_token_id
        b.pending_action = saved.get("pending_action")
        n = b.traj.tool_calls
        if not saved["done"] and n:
            b.resumed = {RESUMED_FIELD: {"tool_calls": n, "actions": list(b.traj.actions[:n])}}
        slots.append(Slot(b, bool(saved["done"])))
    return slots
