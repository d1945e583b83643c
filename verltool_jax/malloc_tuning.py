"""Transparent huge pages for the process's large buffers (glibc's ``hugetlb`` tunable).

XLA's CPU runtime allocates a step's temporary buffers (gigabytes at SmolLM2 size) afresh
on every execution; glibc serves allocations that large with ``mmap`` and returns them
with ``munmap``, so every train step touches all of its memory anew and pays one page
fault per 4 KiB page (about 2 million faults and several seconds of kernel time per
SmolLM2 step on the development machine). With ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``
(glibc >= 2.35) malloc marks those mappings for transparent huge pages, one fault per
2 MiB: the SmolLM2-shaped train step ran 18% faster (README "Performance").

The tunable is read when the process starts, so the command-line entry points re-execute
themselves once with it (:func:`reexec_with_hugepages`); set ``VERLTOOL_MALLOC_HUGEPAGES=0``
to opt out. It only helps when the kernel's transparent-huge-page mode is ``madvise``
(with ``always`` every large mapping gets huge pages already; with ``never`` none can).
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Mapping, Optional

HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT_ENV = "VERLTOOL_MALLOC_HUGEPAGES"
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def tunable_names(current: str) -> set[str]:
    """The names a ``GLIBC_TUNABLES`` value sets (``name=value`` items joined by ``:``)."""
    return {t.split("=", 1)[0] for t in current.split(":") if t}


def tunables_with(current: str, tunable: str) -> str:
    """``current`` (a ``GLIBC_TUNABLES`` value) plus ``tunable``, unless ``current`` already
    sets that name (the user's value wins); empty items dropped."""
    items = [t for t in current.split(":") if t]
    if tunable.split("=", 1)[0] in tunable_names(current):
        return ":".join(items)
    return ":".join([*items, tunable])


def thp_mode(path: Path = THP_MODE_FILE) -> Optional[str]:
    """The kernel's transparent-huge-page mode (the bracketed word of ``path``, e.g.
    ``madvise``), or None where it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def glibc_supports_hugetlb() -> bool:
    """True on glibc >= 2.35, the first release with the ``glibc.malloc.hugetlb`` tunable."""
    lib, version = platform.libc_ver()
    if lib != "glibc":
        return False
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 35)


def wants_reexec(env: Mapping[str, str], mode: Optional[str], glibc_ok: bool) -> bool:
    """Whether a process started with ``env`` should restart itself with the tunable: not
    opted out, glibc has it, the kernel's mode is ``madvise``, and not set yet."""
    if env.get(OPT_OUT_ENV, "1") == "0" or not glibc_ok or mode != "madvise":
        return False
    name = HUGETLB_TUNABLE.split("=", 1)[0]
    return name not in tunable_names(env.get("GLIBC_TUNABLES", ""))


def reexec_with_hugepages() -> None:
    """Re-execute this Python process (same interpreter, same command line, same PID) with
    ``glibc.malloc.hugetlb=1`` added to ``GLIBC_TUNABLES`` when :func:`wants_reexec` says so;
    otherwise return at once. Call it first thing in a command-line ``__main__``."""
    if not wants_reexec(os.environ, thp_mode(), glibc_supports_hugetlb()):
        return
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = tunables_with(env.get("GLIBC_TUNABLES", ""), HUGETLB_TUNABLE)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
