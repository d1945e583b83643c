"""Ctrl-C and SIGTERM: :class:`StopFlag`, which the step loop reads between steps."""

from __future__ import annotations

import logging
import signal

from verltool_jax.train import multihost

log = logging.getLogger(__name__)


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes its step, saves and stops. A second
    signal raises KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.set = False
        self._saved: dict = {}

    def install(self) -> None:
        def handler(signum, frame):
            if self.set:
                raise KeyboardInterrupt
            self.set = True
            log.info(
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
