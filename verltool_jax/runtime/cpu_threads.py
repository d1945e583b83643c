"""XLA's CPU settings, chosen in one place.

``XLA_FLAGS`` is read once, when JAX creates its CPU client, so
:func:`configure_xla_cpu` must run before the first JAX computation. Flags already in
``XLA_FLAGS`` (the user's) win over ours; we only add the missing ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Extra flags, chosen by measurement (benchmarks/model_step.py, docs/performance.md):
# name -> value. Empty: XLA's defaults were the fastest of those we measured.
CPU_FLAGS: Mapping[str, str] = {}


def xla_flags_with(current: str, flags: Mapping[str, str]) -> str:
    """``current`` (an ``XLA_FLAGS`` string) plus ``--name=value`` for each flag in ``flags``
    whose name it does not already set."""
    have = {tok.split("=", 1)[0].lstrip("-") for tok in current.split() if tok.startswith("--")}
    extra = [f"--{k}={v}" for k, v in flags.items() if k not in have]
    return " ".join([current.strip(), *extra]).strip()


def configure_xla_cpu(threads: int) -> str:
    """Set ``XLA_FLAGS`` for a CPU run on ``threads`` cores (1: XLA's Eigen thread pool off,
    so a one-core job does not pay for threads it cannot use); returns the flags."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    flags = dict(CPU_FLAGS)
    if threads == 1:
        flags["xla_cpu_multi_thread_eigen"] = "false"
    os.environ["XLA_FLAGS"] = xla_flags_with(os.environ.get("XLA_FLAGS", ""), flags)
    return os.environ["XLA_FLAGS"]
