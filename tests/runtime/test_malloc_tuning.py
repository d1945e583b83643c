"""glibc malloc tunables: the pure helpers, a real re-exec of a Python process, and the
kept-freed-memory effect measured in a real process."""

import os
import subprocess
import sys

import pytest

from verltool_jax.runtime.malloc_tuning import (
    HUGEPAGES_OPT_OUT_ENV,
    HUGETLB_GLIBC,
    HUGETLB_TUNABLE,
    KEEP_FREED_OPT_OUT_ENV,
    KEEP_FREED_TUNABLES,
    TUNABLES_GLIBC,
    glibc_version,
    thp_mode,
    tunables_with,
    tunables_without,
    wanted_tunables,
    wants_reexec,
    without_keep_freed,
)

KEEP = ":".join(KEEP_FREED_TUNABLES)
NEW_GLIBC, OLD_GLIBC = (2, 36), (2, 28)
GLIBC_HERE = glibc_version() or (0, 0)
needs_tunables = pytest.mark.skipif(GLIBC_HERE < TUNABLES_GLIBC, reason="needs glibc tunables")


def test_tunables_with_adds_once_and_keeps_the_users_value():
    assert tunables_with("", HUGETLB_TUNABLE) == "glibc.malloc.hugetlb=1"
    assert (
        tunables_with("glibc.malloc.arena_max=2", HUGETLB_TUNABLE)
        == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )
    assert tunables_with("glibc.malloc.hugetlb=0", HUGETLB_TUNABLE) == "glibc.malloc.hugetlb=0"
    assert tunables_with("a=1::b=2", HUGETLB_TUNABLE) == "a=1:b=2:glibc.malloc.hugetlb=1"
    assert tunables_with(
        "glibc.malloc.arena_max=4", *KEEP_FREED_TUNABLES
    ) == "glibc.malloc.arena_max=4:" + ":".join(KEEP_FREED_TUNABLES[1:])


def test_tunables_without_drops_only_the_exact_items():
    assert (
        tunables_without(f"a=1:{KEEP}:{HUGETLB_TUNABLE}", *KEEP_FREED_TUNABLES)
        == f"a=1:{HUGETLB_TUNABLE}"
    )
    assert (
        tunables_without("glibc.malloc.arena_max=4", *KEEP_FREED_TUNABLES)
        == "glibc.malloc.arena_max=4"
    )


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(f) == "madvise"
    f.write_text("[always] madvise never\n")
    assert thp_mode(f) == "always"
    assert thp_mode(tmp_path / "missing") is None


def test_wanted_tunables_follow_glibc_the_kernel_and_the_opt_outs():
    assert wanted_tunables({}, "madvise", NEW_GLIBC) == [HUGETLB_TUNABLE, *KEEP_FREED_TUNABLES]
    assert wanted_tunables({}, "always", NEW_GLIBC) == list(KEEP_FREED_TUNABLES)
    assert wanted_tunables({}, "never", NEW_GLIBC) == list(KEEP_FREED_TUNABLES)
    assert wanted_tunables({}, None, NEW_GLIBC) == list(KEEP_FREED_TUNABLES)
    assert wanted_tunables({}, "madvise", OLD_GLIBC) == list(KEEP_FREED_TUNABLES)
    assert wanted_tunables({}, "madvise", (2, 17)) == []  # no tunables at all
    assert wanted_tunables({}, "madvise", None) == []  # musl, macOS
    assert wanted_tunables({HUGEPAGES_OPT_OUT_ENV: "0"}, "madvise", NEW_GLIBC) == list(
        KEEP_FREED_TUNABLES
    )
    assert wanted_tunables({KEEP_FREED_OPT_OUT_ENV: "0"}, "madvise", NEW_GLIBC) == [HUGETLB_TUNABLE]


def test_wants_reexec_only_for_a_wanted_tunable_not_set_yet():
    assert wants_reexec({}, "madvise", NEW_GLIBC)
    assert wants_reexec({}, "never", NEW_GLIBC)  # keep-freed still wanted
    assert not wants_reexec({}, "madvise", None)
    everything = {"GLIBC_TUNABLES": f"{HUGETLB_TUNABLE}:{KEEP}"}
    assert not wants_reexec(everything, "madvise", NEW_GLIBC)
    users = {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=8:"
        "glibc.malloc.mmap_max=9:glibc.malloc.trim_threshold=1"
    }
    assert not wants_reexec(users, "madvise", NEW_GLIBC)  # the user's values win
    assert wants_reexec({"GLIBC_TUNABLES": HUGETLB_TUNABLE}, "madvise", NEW_GLIBC)
    assert not wants_reexec(
        {"GLIBC_TUNABLES": HUGETLB_TUNABLE, KEEP_FREED_OPT_OUT_ENV: "0"}, "madvise", NEW_GLIBC
    )


def test_without_keep_freed_strips_our_items_and_opts_out():
    env = without_keep_freed({"GLIBC_TUNABLES": f"{HUGETLB_TUNABLE}:{KEEP}", "X": "1"})
    assert env == {"GLIBC_TUNABLES": HUGETLB_TUNABLE, "X": "1", KEEP_FREED_OPT_OUT_ENV: "0"}
    assert not wants_reexec({**env, HUGEPAGES_OPT_OUT_ENV: "0"}, "madvise", NEW_GLIBC)
    assert "GLIBC_TUNABLES" not in without_keep_freed({"GLIBC_TUNABLES": KEEP})


CHILD = (
    "import os, sys; from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning; "
    "reexec_with_malloc_tuning(); print(os.getpid(), os.environ.get('GLIBC_TUNABLES', ''), "
    "sys.argv[1:])"
)


def _child(extra_env, code=CHILD):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GLIBC_TUNABLES", HUGEPAGES_OPT_OUT_ENV, KEEP_FREED_OPT_OUT_ENV)
    }
    env.update(extra_env)
    p = subprocess.Popen(
        [sys.executable, "-c", code, "x", "--y=1"], env=env, stdout=subprocess.PIPE, text=True
    )
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0
    return p.pid, out


def _tunables_of(extra_env):
    popen_pid, out = _child(extra_env)
    pid, tunables, argv = out.strip().split(" ", 2)
    return popen_pid, int(pid), tunables, argv


@needs_tunables
def test_the_process_restarts_itself_with_the_tunables_and_keeps_the_users():
    popen_pid, pid, tunables, argv = _tunables_of({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    assert pid == popen_pid  # execve: same process, same PID
    assert argv == "['x', '--y=1']"  # same command line
    huge = f":{HUGETLB_TUNABLE}" if thp_mode() == "madvise" and GLIBC_HERE >= HUGETLB_GLIBC else ""
    assert tunables == "glibc.malloc.arena_max=4" + huge + ":" + ":".join(KEEP_FREED_TUNABLES[1:])


def test_opting_out_of_both_leaves_the_environment_alone():
    *_, tunables, _ = _tunables_of({HUGEPAGES_OPT_OUT_ENV: "0", KEEP_FREED_OPT_OUT_ENV: "0"})
    assert tunables == ""


# A worker thread allocates, touches and frees one 512 MiB block (XLA's temp buffer is one
# such block, allocated from a worker thread's arena); the process then reports its
# resident size and the page faults a second round costs.
FREE_AND_REUSE = """
import ctypes, threading, resource
from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning
reexec_with_malloc_tuning()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
N = 512 << 20
def one_round():
    p = libc.malloc(N)
    ctypes.memset(p, 1, N)
    libc.free(p)
def in_thread():
    t = threading.Thread(target=one_round); t.start(); t.join()
in_thread()
rss = int(open("/proc/self/statm").read().split()[1]) * 4096
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
in_thread()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(rss >> 20, faults)
"""


@needs_tunables
def test_kept_memory_stays_resident_and_the_next_round_does_not_fault():
    _, out = _child({HUGEPAGES_OPT_OUT_ENV: "0"}, FREE_AND_REUSE)
    kept_rss, kept_faults = map(int, out.split())
    _, out = _child({HUGEPAGES_OPT_OUT_ENV: "0", KEEP_FREED_OPT_OUT_ENV: "0"}, FREE_AND_REUSE)
    returned_rss, returned_faults = map(int, out.split())
    assert kept_rss >= returned_rss + 400  # the 512 MiB block stayed resident
    assert kept_faults < 1000  # reused: no page faulted in again
    assert returned_faults > 100_000  # returned: 131,072 4 KiB pages again
