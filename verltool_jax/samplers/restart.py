"""When a dead sampler engine may be restarted, and how long to wait first.

Both vLLM backends (the in-process engine, ``vllm_sampler``, and a ``vllm serve`` server,
``remote_vllm``) restart a dead engine under one :class:`RestartBudget`: at most
``max_restarts`` restarts within any ``window_s`` seconds, attempt ``k`` (0-based, counted
since the engine last served a request) preceded by :func:`backoff_delay`. An engine that
dies now and then over a long run is restarted every time; one that dies again and again
(a bad node, out of memory on every start) exhausts the budget, and the sampler raises
``SamplerDeadError``, which stops the run with exit code 3 (``train/health.py``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

# The one source of the restart defaults (RunConfig's sampler section and both samplers).
DEFAULT_MAX_RESTARTS = 3  # restarts allowed within DEFAULT_RESTART_WINDOW_S
DEFAULT_RESTART_WINDOW_S = 600.0
DEFAULT_RESTART_BACKOFF_S = 1.0  # before the first restart of a death; doubled each retry
RESTART_BACKOFF_CAP_S = 30.0
DEFAULT_DOWN_GRACE_S = 60.0  # how long a server the sampler cannot restart is waited for


def backoff_delay(attempt: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait before restart ``attempt`` (0-based): ``min(cap_s, base_s * 2**attempt)``
    (exponential backoff; no jitter, one engine restarts once per death)."""
    if attempt < 0:
        raise ValueError(f"backoff_delay: attempt must be >= 0, got {attempt}")
    return min(cap_s, base_s * 2.0**attempt)


class RestartBudget:
    """At most ``max_restarts`` restarts within any ``window_s`` seconds (see the module doc).

    :meth:`next_delay` says whether one more restart is allowed now and how long to wait
    before it; :meth:`record` counts one; :meth:`wait_or_raise`, the step of every
    sampler's restart loop, does both or raises; :meth:`served` (the engine answered a
    request) resets the backoff, not the window.
    """

    def __init__(
        self,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        window_s: float = DEFAULT_RESTART_WINDOW_S,
        backoff_s: float = DEFAULT_RESTART_BACKOFF_S,
        backoff_cap_s: float = RESTART_BACKOFF_CAP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_restarts < 0 or window_s <= 0 or backoff_s < 0 or backoff_cap_s < backoff_s:
            raise ValueError(
                "RestartBudget needs max_restarts >= 0, window_s > 0 and "
                f"0 <= backoff_s <= backoff_cap_s; got max_restarts={max_restarts}, "
                f"window_s={window_s}, backoff_s={backoff_s}, backoff_cap_s={backoff_cap_s}"
            )
        self.max_restarts = int(max_restarts)
        self.window_s = float(window_s)
        self.backoff_s = float(backoff_s)
        self.backoff_cap_s = float(backoff_cap_s)
        self.clock = clock
        self.total = 0  # restarts over the sampler's life
        self._recent: collections.deque[float] = collections.deque()
        self._attempt = 0  # restarts since the engine last served

    def _prune(self) -> None:
        now = self.clock()
        while self._recent and now - self._recent[0] >= self.window_s:
            self._recent.popleft()

    def in_window(self) -> int:
        """Restarts within the last ``window_s`` seconds."""
        self._prune()
        return len(self._recent)

    def next_delay(self) -> float | None:
        """Seconds to wait before the next restart, or None when the budget is spent."""
        if self.in_window() >= self.max_restarts:
            return None
        return backoff_delay(self._attempt, self.backoff_s, self.backoff_cap_s)

    def record(self) -> None:
        """One restart (attempted) now."""
        self._recent.append(self.clock())
        self._attempt += 1
        self.total += 1

    def wait_or_raise(
        self, cause: BaseException, dead: Callable[[BaseException, str], Exception]
    ) -> float:
        """One more restart after ``cause`` (the death, or the last failed start): counted
        now, and the seconds to wait before it returned. When the budget is spent, raise
        ``dead(cause, why)`` from ``cause`` (``why``: :meth:`spent`), e.g. a
        ``SamplerDeadError`` naming the engine."""
        delay = self.next_delay()
        if delay is None:
            raise dead(cause, self.spent()) from cause
        self.record()
        return delay

    def served(self) -> None:
        """The engine answered: the next death starts the backoff from ``backoff_s`` again."""
        self._attempt = 0

    def spent(self) -> str:
        """Why no restart is left, for the error message."""
        return (
            f"{self.in_window()} restarts within {self.window_s:g} s "
            f"(max_restarts={self.max_restarts}, restart_window_s={self.window_s:g})"
        )
