"""Request routing over a pool of samplers: sticky per trajectory, else least loaded.

Pure bookkeeping, no I/O, so it is tested on its own. A trajectory's turns go to the
same engine while it is healthy (its earlier turns are in that engine's prefix cache);
a new trajectory, or one whose engine went away, goes to the healthy engine with the
fewest requests in flight (ties: the one picked least recently, spreading the load).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class StickyLeastLoadedRouter:
    """Choose a sampler index for a request.

    ``choose(key, loads, healthy)``: if ``key`` (a trajectory id) was routed before and
    its index is healthy, return it; otherwise ``argmin_i loads[i]`` over healthy ``i``
    (ties broken by least recent use) and remember ``key -> i``. At most ``max_keys``
    keys are remembered (least recently used evicted); ``release(key)`` forgets one.
    """

    def __init__(self, num_samplers: int, max_keys: int = 100_000) -> None:
        if num_samplers < 1:
            raise ValueError(f"a pool needs at least one sampler, got num_samplers={num_samplers}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.num_samplers = num_samplers
        self.max_keys = max_keys
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._last_used = [0] * num_samplers
        self._tick = 0

    def _check(self, seq: Sequence, name: str) -> None:
        if len(seq) != self.num_samplers:
            raise ValueError(f"{name} has {len(seq)} entries; the pool has {self.num_samplers}")

    def choose(
        self, key: str | None, loads: Sequence[int], healthy: Sequence[bool] | None = None
    ) -> int:
        self._check(loads, "loads")
        healthy = [True] * self.num_samplers if healthy is None else list(healthy)
        self._check(healthy, "healthy")
        candidates = [i for i in range(self.num_samplers) if healthy[i]]
        if not candidates:
            raise RuntimeError("no healthy sampler left in the pool")
        self._tick += 1
        if key is not None and key in self._sticky and healthy[self._sticky[key]]:
            idx = self._sticky[key]
            self._sticky.move_to_end(key)
        else:
            idx = min(candidates, key=lambda i: (loads[i], self._last_used[i]))
            if key is not None:
                self._sticky[key] = idx
                self._sticky.move_to_end(key)
                while len(self._sticky) > self.max_keys:
                    self._sticky.popitem(last=False)
        self._last_used[idx] = self._tick
        return idx

    def assigned(self, key: str) -> int | None:
        return self._sticky.get(key)

    def release(self, key: str) -> None:
        """Forget a finished trajectory."""
        self._sticky.pop(key, None)

    def forget_sampler(self, idx: int) -> None:
        """Drop every key pinned to sampler ``idx`` (it died or was removed)."""
        for k in [k for k, v in self._sticky.items() if v == idx]:
            del self._sticky[k]
