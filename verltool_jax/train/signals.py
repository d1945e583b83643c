"""Ctrl-C and SIGTERM: :class:`StopFlag`, which the step loop reads between steps."""

from __future__ import annotations

import signal
from collections.abc import Callable

from verltool_jax.train import multihost


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes its step, saves and stops. A second
    signal raises KeyboardInterrupt at once."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.set = False
        self._say = say
        self._saved: dict = {}

    def install(self) -> None:
        def handler(signum, frame):
            if self.set:
                raise KeyboardInterrupt
            self.set = True
            self._say(
                f"[trainer] signal {signum}: finishing the current step, saving, "
                "stopping (Ctrl-C again to abort)"
            )

        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, handler)
        except ValueError:  # not in the main thread (e.g. under a test runner thread)
            pass

    def agreed(self) -> bool:
        """Whether to stop before the next step: a signal arrived (on any process, so all
        processes stop at the same step)."""
        if multihost.is_multi():
            self.set = multihost.any_true(self.set)
        return self.set

    def uninstall(self) -> None:
        """Give the signals back to the handlers that were there before."""
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved = {}
