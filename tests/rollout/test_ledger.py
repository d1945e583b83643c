"""PromptLedger: every draw of the prompt stream ends once (trained, no-signal, unusable)
or is in flight; given-back prompts come first under a new group id; the state round-trips
through a checkpoint's JSON; each kind of mismatch is reported."""

import json
import threading

import pytest

from verltool_jax.rollout.agent_loop import PromptItem
from verltool_jax.rollout.ledger import Accounting, PromptLedger, from_ranges, to_ranges
from verltool_jax.rollout.trajectory import Trajectory


def stream(n: int, start: int = 0):
    return iter((i, PromptItem([1, i], group_id=f"s{i}-{i}")) for i in range(start, start + n))


def group(item: PromptItem, n: int = 2) -> list[Trajectory]:
    return [Trajectory(f"{item.gid()}-{k}", item.gid(), [1]) for k in range(n)]


def test_ranges_round_trip():
    s = {0, 1, 2, 5, 7, 8}
    assert to_ranges(s) == [[0, 3], [5, 6], [7, 9]]
    assert from_ranges(to_ranges(s)) == s and to_ranges([]) == []


def test_every_draw_ends_once_and_given_back_prompts_come_first():
    led, src = PromptLedger(), stream(10)
    items = [led.draw(src)[1] for _ in range(4)]
    led.end([group(items[0])], "trained")
    led.end([group(items[1])], "no_signal")
    led.give_back([group(items[2])], "skipped")
    key, again = led.start_waiting()  # before any new draw, under a new group id
    assert key == 2 and again.gid() == "s2-2.a1" and again.prompt_ids == items[2].prompt_ids
    led.give_back([group(again)], "stale")
    assert led.start_waiting()[1].gid() == "s2-2.a2"  # the base id, not nested
    assert led.start_waiting() is None
    r = led.report()
    assert r.ok and (r.drawn, r.trained, r.no_signal, r.in_flight) == (4, 1, 1, 2)
    assert r.given_back == {"skipped": 1, "failed": 0, "stale": 1}
    assert "data accounting exact: 4 prompts drawn" in r.describe()


def test_state_round_trips_and_the_resumed_ledger_stays_exact():
    led, src = PromptLedger(), stream(10)
    items = [led.draw(src)[1] for _ in range(5)]
    led.end([group(i) for i in items[:3]], "trained")
    led.give_back([group(items[3])], "failed")  # waiting, not started: still in flight
    pos = {"consumed": 5}
    saved = json.loads(json.dumps(led.state(lambda: pos)))
    assert saved["prompts"] == pos and saved["replay"] == [[3, 3], [4, 4]]
    assert saved["ledger"]["trained"] == [[0, 3]]

    rebuilt = []

    def rebuild(key, serial):
        rebuilt.append((key, serial))
        return PromptItem([1, key], group_id=f"r{serial}-{key}")

    back = PromptLedger.restore(saved, rebuild)
    assert rebuilt == [(3, 3), (4, 4)]
    waiting = [back.start_waiting()[1] for _ in range(2)]
    new = back.draw(stream(1, start=5))[1]
    back.end([group(i) for i in waiting + [new]], "trained")
    r = back.report()
    assert r.ok and (r.drawn, r.trained, r.in_flight) == (6, 6, 0)
    assert r.given_back["failed"] == 1


def test_a_replay_that_no_longer_fits_ends_unusable_and_old_checkpoints_load():
    old = {"prompts": {}, "replay": [7, 9]}  # before the ledger: keys alone
    led = PromptLedger.restore(
        old, lambda key, s: None if key == 9 else PromptItem([key], [], f"r{s}-{key}")
    )
    assert led.drawn == 2 and led.start_waiting()[1].gid() == "r0-7"
    r = led.report()
    assert r.ok and (r.unusable, r.in_flight) == (1, 1)


def test_mismatches_are_reported():
    led, src = PromptLedger(), stream(5)
    a, _ = led.draw(src)[1], led.draw(src)[1]
    led.end([group(a)], "trained")
    led.end([group(a)], "trained")  # the same group again: unknown (not in flight)
    led.end([group(PromptItem([1], group_id="x"))], "trained")
    led._pending.clear()  # b vanished: drawn, neither ended nor in flight
    r = led.report()
    assert not r.ok and r.lost == [1] and r.unknown == ["s0-0", "x"]
    assert "DATA ACCOUNTING MISMATCH" in r.describe()
    # an entry ended twice (e.g. a replay of a prompt already trained)
    saved = {"ledger": {"drawn": 1, "trained": [[0, 1]]}, "replay": [[0, 0]]}
    twice = PromptLedger.restore(saved, lambda k, s: PromptItem([1], group_id="r0-0"))
    twice.end([group(twice.start_waiting()[1])], "trained")
    assert twice.report().twice == [0] and not twice.report().ok
    with pytest.raises(ValueError, match="outcome"):
        led.end([], "lost")


def test_merge_sums_processes():
    parts = [
        Accounting(drawn=3, trained=2, in_flight=1, given_back={"stale": 1}).to_json(),
        Accounting(drawn=2, trained=2, given_back={"stale": 2}).to_json(),
    ]
    m = Accounting.merge(parts)
    assert m.ok and (m.drawn, m.trained, m.in_flight) == (5, 4, 1) and m.given_back == {"stale": 3}


def test_a_snapshot_never_splits_a_draw_from_its_entry():
    """Draws in a worker thread while another thread snapshots: in every snapshot the
    source position equals the serials drawn (each draw counted once, in flight)."""
    led, src = PromptLedger(), stream(2000)
    pos = {"n": 0}

    def counted():
        for k, it in src:
            pos["n"] += 1
            yield k, it

    gen = counted()
    t = threading.Thread(target=lambda: [led.draw(gen) for _ in range(2000)])
    t.start()
    snaps = []
    while t.is_alive():
        snaps.append(led.state(lambda: pos["n"]))
    t.join()
    for s in snaps:
        assert s["prompts"] == s["ledger"]["drawn"] == len(s["replay"])


def test_a_kept_group_resumes_under_its_id_unless_its_prompt_changed():
    led, src = PromptLedger(), stream(10)
    items = [led.draw(src)[1] for _ in range(3)]
    led.give_back([group(items[1])], "stale")
    led.start_waiting()  # s1-1.a1, started again

    def rollouts(entries):  # what the producer keeps: draws 1 (again) and 2
        return [
            {"serial": e.serial, "gid": gid, "base_gid": e.base_gid, "attempt": e.attempt,
             "prompt_ids": e.item.prompt_ids, "trajectories": []}
            for gid, e in entries.items() if e.serial > 0
        ]  # fmt: skip

    saved = json.loads(json.dumps(led.state(rollouts=rollouts)))
    assert {r["gid"] for r in saved["rollouts"]} == {"s1-1.a1", "s2-2"}

    def rebuild(key, serial):  # row 2's prompt changed since (a new template)
        return PromptItem([1, key] + ([9] if key == 2 else []), group_id=f"r{serial}-{key}")

    back = PromptLedger.restore(saved, rebuild)
    assert list(back.resumed) == ["s1-1.a1"]  # goes on; row 2 is sampled again
    assert [back.start_waiting()[1].gid() for _ in range(3)] == ["r0-0", "s1-1.a1", "r2-2"]
    back.give_back([group(PromptItem([1, 1], group_id="s1-1.a1"))], "stale")
    assert back.start_waiting()[1].gid() == "s1-1.a2"  # its attempt count went on
    assert back.report().ok
