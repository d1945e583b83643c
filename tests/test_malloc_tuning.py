"""glibc huge-page tunable: the pure helpers, and a real re-exec of a Python process."""
import os
import subprocess
import sys

from verltool_jax.malloc_tuning import (HUGETLB_TUNABLE, OPT_OUT_ENV, glibc_supports_hugetlb,
                                        thp_mode, tunables_with, wants_reexec)


def test_tunables_with_adds_once_and_keeps_the_users_value():
    assert tunables_with("", HUGETLB_TUNABLE) == "glibc.malloc.hugetlb=1"
    assert (tunables_with("glibc.malloc.arena_max=2", HUGETLB_TUNABLE)
            == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    assert tunables_with("glibc.malloc.hugetlb=0", HUGETLB_TUNABLE) == "glibc.malloc.hugetlb=0"
    assert tunables_with("a=1::b=2", HUGETLB_TUNABLE) == "a=1:b=2:glibc.malloc.hugetlb=1"


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(f) == "madvise"
    f.write_text("[always] madvise never\n")
    assert thp_mode(f) == "always"
    assert thp_mode(tmp_path / "missing") is None


def test_wants_reexec_only_when_it_can_help_and_is_not_set():
    assert wants_reexec({}, "madvise", True)
    assert not wants_reexec({}, "always", True)          # huge pages already
    assert not wants_reexec({}, "never", True)
    assert not wants_reexec({}, None, True)
    assert not wants_reexec({}, "madvise", False)        # old glibc / musl
    assert not wants_reexec({OPT_OUT_ENV: "0"}, "madvise", True)
    assert not wants_reexec({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "madvise", True)
    assert not wants_reexec({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", True)
    assert wants_reexec({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", True)


CHILD = ("import os, sys; from verltool_jax.malloc_tuning import reexec_with_hugepages; "
         "reexec_with_hugepages(); print(os.getpid(), os.environ.get('GLIBC_TUNABLES', ''), "
         "sys.argv[1:])")


def _child(extra_env):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_OUT_ENV)}
    env.update(extra_env)
    p = subprocess.Popen([sys.executable, "-c", CHILD, "x", "--y=1"], env=env,
                         stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    pid, tunables, argv = out.strip().split(" ", 2)
    return p.pid, int(pid), tunables, argv


def test_the_process_restarts_itself_with_the_tunable_where_it_helps():
    popen_pid, pid, tunables, argv = _child({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    assert pid == popen_pid                  # execve: same process, same PID
    assert argv == "['x', '--y=1']"          # same command line
    if thp_mode() == "madvise" and glibc_supports_hugetlb():
        assert tunables == "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1"
    else:
        assert tunables == "glibc.malloc.arena_max=4"


def test_opt_out_leaves_the_environment_alone():
    _, _, tunables, _ = _child({OPT_OUT_ENV: "0"})
    assert tunables == ""
