"""The data accounting of a run: every prompt drawn from the prompt stream, from its draw
to its end.

A *draw* is one prompt handed out by the shuffled, repeating prompt stream (a data row
comes back once per epoch: each time is its own draw). The ledger numbers draws 0, 1, 2,
... (the serial, saved with every checkpoint, so numbering continues on resume) and
follows each one:

* **in flight**: drawn and being rolled out, waiting in the queue, or waiting to be rolled
  out again; a checkpoint saves these and the resumed run rolls them out first, going on
  with the trajectories the checkpoint kept (``rollouts``, :mod:`verltool_jax.rollout.inflight`)
  under their group id, and sampling the others again from their prompts;
* **given back** (:meth:`PromptLedger.give_back`): its group was not trained on because
  the batch was skipped (too many failed trajectories), every trajectory of the group
  failed, or the queue dropped it as too stale; the prompt is rolled out again (a new
  group id) before any new draw: in flight again;
* **ended** (:meth:`PromptLedger.end`): ``trained`` (its group was in an update; failed
  trajectories of a group are left out of the update and not rolled out again),
  ``no_signal`` (dropped by the no-signal filter, DAPO's dynamic sampling: like verl's
  ``filter_groups``, the prompt's turn is used up, not retried) or ``unusable`` (a
  prompt to replay that no longer fits the prompt budget after a config change).

The check (:meth:`PromptLedger.report`): every draw ``0..drawn-1`` is in exactly one of
the ended sets or in flight, none ended twice, no group ended that the ledger did not
hand out. The draw, its entry in flight and the prompt source's position change
together under one lock, so a snapshot (:meth:`PromptLedger.state`) never holds a
prompt both drawn and not in flight, whatever thread draws.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from verltool_jax.rollout.agent_loop import PromptItem
from verltool_jax.rollout.trajectory import Trajectory

Keyed = tuple[Hashable, PromptItem]
OUTCOMES = ("trained", "no_signal", "unusable")  # how a draw ends
GIVE_BACK_REASONS = ("skipped", "failed", "stale")


def to_ranges(serials: Iterable[int]) -> list[list[int]]:
    """Sorted half-open ranges ``[[a, b], ...]`` covering ``serials`` (compact JSON)."""
    out: list[list[int]] = []
    for s in sorted(set(serials)):
        if out and out[-1][1] == s:
            out[-1][1] = s + 1
        else:
            out.append([s, s + 1])
    return out


def from_ranges(ranges: Iterable[Sequence[int]]) -> set[int]:
    return {s for a, b in ranges for s in range(int(a), int(b))}


@dataclass
class Entry:
    """One draw in flight: its serial, the source's key (a row index), the prompt, and
    how many times it was given back (its group id then gets ``.a<n>``)."""

    serial: int
    key: Hashable
    item: PromptItem
    attempt: int = 0
    base_gid: str = ""

    def __post_init__(self) -> None:
        self.base_gid = self.base_gid or self.item.gid()


@dataclass
class Accounting:
    """The check of a run's data accounting (see the module doc); ``ok`` when exact."""

    drawn: int = 0
    trained: int = 0
    no_signal: int = 0
    unusable: int = 0
    in_flight: int = 0
    given_back: dict[str, int] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)  # drawn, neither ended nor in flight
    twice: list[int] = field(default_factory=list)  # ended more than once
    unknown: list[str] = field(default_factory=list)  # group ids ended but never handed out

    @property
    def ok(self) -> bool:
        ended = self.trained + self.no_signal + self.unusable
        return (
            not (self.lost or self.twice or self.unknown) and ended + self.in_flight == self.drawn
        )

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"ok": self.ok}

    @staticmethod
    def merge(parts: Sequence[dict]) -> Accounting:
        """The sum of several processes' ``to_json()`` (each checks its own draws)."""
        total = Accounting()
        for p in parts:
            for k in ("drawn", "trained", "no_signal", "unusable", "in_flight"):
                setattr(total, k, getattr(total, k) + int(p[k]))
            for k in ("lost", "twice", "unknown"):
                getattr(total, k).extend(p[k])
            for r, n in p["given_back"].items():
                total.given_back[r] = total.given_back.get(r, 0) + int(n)
        return total

    def describe(self) -> str:
        back = ", ".join(f"{n} {r}" for r, n in sorted(self.given_back.items()) if n) or "none"
        line = (
            f"{self.drawn} prompts drawn: {self.trained} trained once, {self.no_signal} "
            f"dropped by the no-signal filter, {self.in_flight} in flight (saved for the "
            f"next run)"
            + (f", {self.unusable} unusable on resume" if self.unusable else "")
            + f"; rolled out again after a give-back: {back}"
        )
        if self.ok:
            return "data accounting exact: " + line
        return (
            f"DATA ACCOUNTING MISMATCH: {line}; lost (drawn, never ended) {self.lost[:20]}, "
            f"ended twice {self.twice[:20]}, unknown groups {self.unknown[:20]}"
        )


class PromptLedger:
    """Numbers the draws of a prompt source and follows each to its end (module doc)."""

    def __init__(
        self,
        drawn: int = 0,
        ended: dict[str, set[int]] | None = None,
        given_back: dict[str, int] | None = None,
        twice: Sequence[int] = (),
    ) -> None:
        self.drawn = drawn
        self.ended = {o: set((ended or {}).get(o, ())) for o in OUTCOMES}
        self.given_back = {r: int((given_back or {}).get(r, 0)) for r in GIVE_BACK_REASONS}
        self.twice = list(twice)
        self.unknown: list[str] = []
        self._pending: dict[str, Entry] = {}  # group id -> entry: started, not ended
        self._waiting: deque[Entry] = deque()  # to roll out (again) before new draws
        self._lock = threading.Lock()
        # saved groups to go on with (``rollouts`` of the checkpoint), by group id
        self.resumed: dict[str, dict] = {}

    # -------------------------------------------------------------- state
    @classmethod
    def restore(
        cls, saved: dict, rebuild: Callable[[Hashable, int], PromptItem | None]
    ) -> PromptLedger:
        """The ledger of a checkpoint's data item ``saved`` (``{}`` for a fresh run):
        its counts, and its prompts in flight waiting to be rolled out first.
        ``rebuild(key, serial)`` makes a replayed prompt (None: it no longer fits;
        counted ``unusable``). A draw whose group the checkpoint kept (``rollouts``) and
        whose prompt rebuilds to the same ids keeps its group id, attempt count and
        record (:attr:`resumed`, for the producer to go on with). A checkpoint from before
        the ledger (``replay`` a list of keys) starts the numbering afresh at its position."""
        s = saved.get("ledger") or {}
        ledger = cls(
            drawn=int(s.get("drawn", 0)),
            ended={o: from_ranges(s.get(o, [])) for o in OUTCOMES},
            given_back=s.get("given_back"),
            twice=s.get("twice", []),
        )
        kept = {int(r["serial"]): r for r in saved.get("rollouts", [])}
        for entry in saved.get("replay", []):
            if isinstance(entry, list):
                serial, key = int(entry[0]), entry[1]
            else:  # an older checkpoint: the key alone
                serial, key = ledger.drawn, entry
                ledger.drawn += 1
            item = rebuild(key, serial)
            rec = kept.get(serial)
            if item is None:
                ledger.ended["unusable"].add(serial)
            elif rec is not None and rec["prompt_ids"] == item.prompt_ids:
                item = dataclasses.replace(item, group_id=rec["gid"])
                ledger._waiting.append(Entry(serial, key, item, rec["attempt"], rec["base_gid"]))
                ledger.resumed[rec["gid"]] = rec
            else:
                ledger._waiting.append(Entry(serial, key, item))
        return ledger

    def state(
        self,
        source_state: Callable[[], Any] = lambda: None,
        rollouts: Callable[[dict[str, Entry]], list[dict]] = lambda entries: [],
    ) -> dict:
        """The data position to checkpoint, taken with ``source_state()`` (the prompt
        source's position) under the lock: ``prompts``, ``replay`` (``[serial, key]`` of
        every prompt in flight), ``rollouts`` (the records of the groups in flight that
        ``rollouts(entries)`` keeps, given the draws in flight by group id;
        :func:`verltool_jax.rollout.inflight.snapshot`) and ``ledger`` (counts and ended
        serials as ranges)."""
        with self._lock:
            flight = sorted((e.serial, e.key) for e in self._in_flight())
            return {
                "prompts": source_state(),
                "replay": [list(p) for p in flight],
                "rollouts": rollouts({e.item.gid(): e for e in self._in_flight()}),
                "ledger": {
                    "drawn": self.drawn,
                    **{o: to_ranges(self.ended[o]) for o in OUTCOMES},
                    "given_back": dict(self.given_back),
                    "twice": list(self.twice),
                },
            }

    def _in_flight(self) -> list[Entry]:
        return list(self._pending.values()) + list(self._waiting)

    def in_flight_keys(self) -> list:
        with self._lock:
            return [e.key for e in self._in_flight()]

    # -------------------------------------------------------------- the producer's side
    def add_waiting(self, pairs: Iterable[Keyed]) -> None:
        """Prompts to roll out before any new draw, numbered as new draws (a producer's
        ``replay`` argument)."""
        with self._lock:
            for key, item in pairs:
                self._waiting.append(Entry(self.drawn, key, item))
                self.drawn += 1

    def start_waiting(self) -> Keyed | None:
        """The next prompt waiting to be rolled out (again), now started; None if none."""
        with self._lock:
            if not self._waiting:
                return None
            e = self._waiting.popleft()
            self._pending[e.item.gid()] = e
            return e.key, e.item

    def draw(self, source: Iterator[Keyed]) -> Keyed | None:
        """The next prompt of ``source`` (None when it ran out), numbered and started;
        blocking (call it in a worker thread); the source advances under the lock."""
        with self._lock:
            nxt = next(source, None)
            if nxt is not None:
                self._pending[nxt[1].gid()] = Entry(self.drawn, *nxt)
                self.drawn += 1
            return nxt

    # -------------------------------------------------------------- the trainer's side
    def _pop(self, group: Sequence[Trajectory]) -> Entry | None:
        gid = group[0].group_id
        e = self._pending.pop(gid, None)
        if e is None:
            self.unknown.append(gid)
        return e

    def end(self, groups: Sequence[Sequence[Trajectory]], outcome: str) -> None:
        """``groups`` (each a whole group, as the producer made it) ended as ``outcome``."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r} must be one of {list(OUTCOMES)}")
        with self._lock:
            for g in groups:
                e = self._pop(g) if g else None
                if e is None:
                    continue
                if any(e.serial in s for s in self.ended.values()):
                    self.twice.append(e.serial)
                self.ended[outcome].add(e.serial)

    def give_back(self, groups: Sequence[Sequence[Trajectory]], reason: str) -> None:
        """``groups`` were not trained on (``reason``: skipped, failed, stale): their
        prompts are rolled out again, first, under a new group id."""
        if reason not in GIVE_BACK_REASONS:
            raise ValueError(f"reason {reason!r} must be one of {list(GIVE_BACK_REASONS)}")
        with self._lock:
            back = []
            for g in groups:
                e = self._pop(g) if g else None
                if e is None:
                    continue
                e.attempt += 1
                gid = f"{e.base_gid}.a{e.attempt}"
                back.append(dataclasses.replace(e, item=dataclasses.replace(e.item, group_id=gid)))
                self.given_back[reason] += 1
            self._waiting.extendleft(reversed(back))

    # -------------------------------------------------------------- the check
    def report(self) -> Accounting:
        """The accounting now (see the module doc)."""
        with self._lock:
            counts = Counter(e.serial for e in self._in_flight())
            for ended_set in self.ended.values():
                counts.update(ended_set)
            flight = {e.serial for e in self._in_flight()}
            ended = set().union(*self.ended.values())
            twice = list(self.twice) + [s for s, n in counts.items() if n > 1]
            return Accounting(
                drawn=self.drawn,
                trained=len(self.ended["trained"]),
                no_signal=len(self.ended["no_signal"]),
                unusable=len(self.ended["unusable"]),
                in_flight=len(flight),
                given_back=dict(self.given_back),
                lost=sorted(set(range(self.drawn)) - flight - ended),
                twice=sorted(set(twice)),
                unknown=list(self.unknown),
            )
