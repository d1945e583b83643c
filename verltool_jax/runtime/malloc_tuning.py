"""glibc malloc settings for XLA's CPU runtime: huge pages, and freed memory kept in the process.

XLA's CPU runtime allocates a step's temporary buffers afresh on every execution, as one
block (``posix_memalign`` of the compiled step's whole temp size: 6.1 GiB for a SmolLM2-135M
train step of 4 x 512 tokens) from whichever glibc arena the calling XLA worker thread
uses, and frees it when the step ends. Two costs follow, and a tunable each removes:

* **Huge pages** (``glibc.malloc.hugetlb=1``, glibc >= 2.35, kernel THP mode ``madvise``):
  glibc marks its large mappings for transparent huge pages, one page fault per 2 MiB
  instead of per 4 KiB (-18% per SmolLM2 step, docs/performance.md).
* **Freed memory kept** (``glibc.malloc.arena_max=1``, ``glibc.malloc.mmap_max=0``,
  ``glibc.malloc.trim_threshold=`` 1 TiB; glibc >= 2.26). A block that large is served by
  ``mmap`` and returned by ``munmap`` however ``mmap_max`` is set when it comes from a
  thread's arena (glibc's non-main arenas grow in heaps of at most 64 MiB and fall back to
  ``mmap`` beyond that), so all threads share the main arena (``arena_max=1``), which grows
  with ``brk``; ``mmap_max=0`` keeps it from mapping blocks apart, and the trim threshold
  keeps ``free`` from giving the top of the heap back. The process then holds its peak
  and every later step reuses the same resident pages: no page faults, no zeroing, and
  nothing for a VM's free-page reporting to take back while the step waits (on the
  development VM a SmolLM2 step after a 15 s pause took 41-49 s with the memory returned,
  15-17 s with it kept). The price is memory: the process keeps its peak resident until
  it exits, as a GPU runtime keeps its memory pool.

The tunables are read when a process starts, so the command-line entry points re-execute
themselves once with the ones missing (:func:`reexec_with_malloc_tuning`); child processes
inherit them. ``VERLTOOL_MALLOC_HUGEPAGES=0`` and ``VERLTOOL_MALLOC_KEEP_FREED=0`` opt
out of each; a tunable the user already set in ``GLIBC_TUNABLES`` wins.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"
KEEP_FREED_TUNABLES = (
    "glibc.malloc.arena_max=1",
    "glibc.malloc.mmap_max=0",
    f"glibc.malloc.trim_threshold={1 << 40}",
)
HUGEPAGES_OPT_OUT_ENV = "VERLTOOL_MALLOC_HUGEPAGES"
KEEP_FREED_OPT_OUT_ENV = "VERLTOOL_MALLOC_KEEP_FREED"
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGETLB_GLIBC = (2, 35)  # first release with glibc.malloc.hugetlb
TUNABLES_GLIBC = (2, 26)  # first release with GLIBC_TUNABLES


def tunable_name(tunable: str) -> str:
    """``glibc.malloc.mmap_max`` of ``glibc.malloc.mmap_max=0``."""
    return tunable.split("=", 1)[0]


def tunable_names(current: str) -> set[str]:
    """The names a ``GLIBC_TUNABLES`` value sets (``name=value`` items joined by ``:``)."""
    return {tunable_name(t) for t in current.split(":") if t}


def tunables_with(current: str, *tunables: str) -> str:
    """``current`` (a ``GLIBC_TUNABLES`` value) plus each of ``tunables`` whose name it does
    not set yet (the user's value wins); empty items dropped."""
    items = [t for t in current.split(":") if t]
    names = tunable_names(current)
    items += [t for t in tunables if tunable_name(t) not in names]
    return ":".join(items)


def tunables_without(current: str, *tunables: str) -> str:
    """``current`` without the items equal to one of ``tunables`` (a value the user set
    differently stays)."""
    drop = set(tunables)
    return ":".join(t for t in current.split(":") if t and t not in drop)


def thp_mode(path: Path = THP_MODE_FILE) -> str | None:
    """The kernel's transparent-huge-page mode (the bracketed word of ``path``, e.g.
    ``madvise``), or None where it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library when it is glibc, else None (musl, macOS)."""
    lib, version = platform.libc_ver()
    if lib != "glibc":
        return None
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def wanted_tunables(
    env: Mapping[str, str], mode: str | None, glibc: tuple[int, int] | None
) -> list[str]:
    """The tunables a process started with ``env`` should run with: huge pages where glibc
    has the tunable and the kernel's THP mode is ``madvise`` (with ``always`` every large
    mapping gets them already, with ``never`` none can), the keep-freed-memory set where
    glibc has tunables at all; each unless opted out."""
    if glibc is None:
        return []
    wanted: list[str] = []
    if env.get(HUGEPAGES_OPT_OUT_ENV, "1") != "0" and glibc >= HUGETLB_GLIBC and mode == "madvise":
        wanted.append(HUGETLB_TUNABLE)
    if env.get(KEEP_FREED_OPT_OUT_ENV, "1") != "0" and glibc >= TUNABLES_GLIBC:
        wanted.extend(KEEP_FREED_TUNABLES)
    return wanted


def wants_reexec(env: Mapping[str, str], mode: str | None, glibc: tuple[int, int] | None) -> bool:
    """Whether a process started with ``env`` must restart to get a wanted tunable: one of
    :func:`wanted_tunables` whose name ``GLIBC_TUNABLES`` does not set yet."""
    current = tunable_names(env.get("GLIBC_TUNABLES", ""))
    return any(tunable_name(t) not in current for t in wanted_tunables(env, mode, glibc))


def without_keep_freed(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` for a child process that must return freed memory (one that
    measures its peak resident size, say): the keep-freed tunables this module added
    removed, and opted out so the child does not add them back."""
    out = dict(env)
    tunables = tunables_without(out.get("GLIBC_TUNABLES", ""), *KEEP_FREED_TUNABLES)
    if tunables:
        out["GLIBC_TUNABLES"] = tunables
    else:
        out.pop("GLIBC_TUNABLES", None)
    out[KEEP_FREED_OPT_OUT_ENV] = "0"
    return out


def reexec_with_malloc_tuning() -> None:
    """Re-execute this Python process (same interpreter, same command line, same PID) with
    :func:`wanted_tunables` added to ``GLIBC_TUNABLES`` when :func:`wants_reexec` says so;
    otherwise return at once. Call it first thing in a command-line ``__main__``."""
    env = dict(os.environ)
    mode, glibc = thp_mode(), glibc_version()
    if not wants_reexec(env, mode, glibc):
        return
    wanted = wanted_tunables(env, mode, glibc)
    env["GLIBC_TUNABLES"] = tunables_with(env.get("GLIBC_TUNABLES", ""), *wanted)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
