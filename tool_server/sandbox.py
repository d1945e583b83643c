"""Bubblewrap sandbox: argv builder, resource limits and an availability probe.

Every tool that runs model-written code (``python_code``, ``bash``) runs it under
``bwrap`` with:

* new pid, ipc, uts, cgroup and (unless ``network=True``) net namespaces, so the code
  sees only its own processes and has no network at all (not even loopback to the host);
* a read-only view of ``/usr`` (with the ``/bin``, ``/lib*``, ``/sbin`` symlinks), a
  minimal ``/etc`` and the Python installation (``sys.base_prefix`` and the venv's
  ``sys.prefix``) at their own paths; nothing else of the host: not ``/root``, not
  ``/home``, not ``/work`` or the repository;
* a private ``/tmp`` (a tmpfs of at most ``tmp_mb`` MiB; ``/var/tmp`` is a link to it),
  a minimal ``/dev`` and a fresh ``/proc``;
* the work dir, bound at :data:`SANDBOX_WORKDIR`, as the only host path it can write (or,
  with ``workdir=None``, a second bounded tmpfs there: no host path is writable at all);
* resource limits (:class:`ResourceLimits`) applied inside the sandbox by ``prlimit``
  just before the command, and a wall-clock limit the caller enforces.

``RLIMIT_NPROC`` is never enforced for uid 0, so when the server runs as root the
sandbox does not map a user namespace: bwrap (as root) sets up the mounts, and
``setpriv`` drops to an unprivileged uid from :func:`sandbox_uid` (all capabilities
dropped, ``no_new_privs``) before the command runs. As a normal user, bwrap creates a
user namespace and the code runs as that user. Each server process owns a block of
:data:`UID_BLOCK` uids, claimed with a lock file (:func:`uid_block`), so two servers on one
host never hand out the same uid.

The sandbox's pid 1 is bwrap's own init, whose command line every process inside can read
(``/proc/1/cmdline``). :func:`packed_argv` moves bwrap's options (host paths: the work dir,
the Python installation) into a memory file read through ``--args FD``, so what the code
can see is ``bwrap --args N -- <command>``; commands are named by their base name (looked
up on the sandbox's ``PATH``), not by host path.

If bubblewrap cannot be used here, :func:`require_sandbox` raises
:class:`SandboxUnavailable` and tools refuse to run code (fail closed).

Usage::

    ok, why = sandbox_status()
    argv = bwrap_argv(workdir, limits=ResourceLimits(cpu_s=5, wall_s=5)) + ["python3", "-c", code]
    argv, fd = packed_argv(argv)          # optional: hide the options from /proc/1/cmdline
    try:
        subprocess.run(argv, pass_fds=(fd,), timeout=limits.wall_s, ...)
    finally:
        os.close(fd)
"""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "SANDBOX_WORKDIR",
    "ResourceLimits",
    "SandboxUnavailable",
    "sandbox_status",
    "require_sandbox",
    "bwrap_argv",
    "sandbox_uid",
    "python_prefixes",
    "bwrap_path",
    "packed_argv",
    "uid_block",
    "UID_BLOCK",
    "DEFAULT_TMP_MB",
    "ProcessHandle",
]

# Where the work dir appears inside the sandbox (also the default cwd and $HOME).
SANDBOX_WORKDIR = "/workspace"

# Unprivileged uids used when the server runs as root (one per sandbox, rotating, so
# that RLIMIT_NPROC, which counts processes per uid, does not couple two sandboxes).
# Each server process claims its own block of UID_BLOCK uids (see uid_block).
_UID_BASE = 200_000
UID_BLOCK = 4096
_UID_SLOTS = 4096  # blocks available: uids 200000 .. 200000 + 4096 * 4096
_uid_counter = itertools.count()
_uid_lock = threading.Lock()
_uid_block: tuple[int, int, int] | None = None  # (first uid, lock fd, pid)

# Size of the sandbox's /tmp (and of /workspace when it is a tmpfs), MiB.
DEFAULT_TMP_MB = 256

# Host files of /etc a program may need (dynamic loader, locale, users, alternatives).
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/alternatives",
    "/etc/mime.types",
    "/etc/ssl/certs",
)
_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

Bind = str | tuple[str, str]


class SandboxUnavailable(RuntimeError):
    """Bubblewrap cannot be used here; code must not run (fail closed)."""


@dataclass(frozen=True)
class ResourceLimits:
    """Per-process limits applied inside the sandbox.

    Fields (all must be positive):
      cpu_s      RLIMIT_CPU, seconds of CPU time (SIGXCPU at ``cpu_s``, SIGKILL at ``cpu_s+1``)
      memory_mb  RLIMIT_AS, address space in MiB
      nproc      RLIMIT_NPROC, processes/threads of the sandbox uid
      nofile     RLIMIT_NOFILE, open file descriptors
      fsize_mb   RLIMIT_FSIZE, largest file the code may write, MiB
      wall_s     wall-clock limit; enforced by the caller (``subprocess`` timeout / kill)
      total_memory_mb  memory of all processes of one call together, MiB (``None``: not
                 measured); enforced by whoever runs the call (the python worker measures
                 it, see ``python_worker.call_memory_bytes``)
    """

    cpu_s: int = 10
    memory_mb: int = 1024
    nproc: int = 64
    nofile: int = 256
    fsize_mb: int = 64
    wall_s: float = 10.0
    total_memory_mb: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "cpu_s",
            "memory_mb",
            "nproc",
            "nofile",
            "fsize_mb",
            "wall_s",
            "total_memory_mb",
        ):
            value = getattr(self, name)
            if value is None and name == "total_memory_mb":
                continue
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ResourceLimits.{name} must be a positive number, got {value!r}")

    def rlimits(self) -> list[tuple[int, tuple[int, int]]]:
        """``[(resource.RLIMIT_*, (soft, hard)), ...]`` for :func:`resource.setrlimit`."""
        import resource

        mib = 1024 * 1024
        cpu = int(max(1, round(self.cpu_s)))
        return [
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
            (resource.RLIMIT_AS, (self.memory_mb * mib, self.memory_mb * mib)),
            (resource.RLIMIT_NPROC, (self.nproc, self.nproc)),
            (resource.RLIMIT_NOFILE, (self.nofile, self.nofile)),
            (resource.RLIMIT_FSIZE, (self.fsize_mb * mib, self.fsize_mb * mib)),
            (resource.RLIMIT_CORE, (0, 0)),
        ]

    def apply(self) -> None:
        """Set these limits on the calling process (e.g. in a forked child, or as a
        ``preexec_fn``). Lowering limits needs no privilege."""
        import resource

        for res, pair in self.rlimits():
            resource.setrlimit(res, pair)

    def prlimit_argv(self) -> list[str]:
        """``prlimit ... --`` prefix that applies these limits to the command after it."""
        mib = 1024 * 1024
        cpu = int(max(1, round(self.cpu_s)))
        return [
            "prlimit",
            f"--cpu={cpu}:{cpu + 1}",
            f"--as={self.memory_mb * mib}",
            f"--nproc={self.nproc}",
            f"--nofile={self.nofile}",
            f"--fsize={self.fsize_mb * mib}",
            "--core=0",
            "--",
        ]


def bwrap_path() -> str | None:
    """The bubblewrap binary (``$VERLTOOL_BWRAP`` overrides; tests point it at a
    missing file to exercise the fail-closed path)."""
    override = os.environ.get("VERLTOOL_BWRAP")
    if override is not None:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("bwrap")


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _uid_lock_dir() -> str:
    """Where the uid block lock files live (``$VERLTOOL_UID_LOCK_DIR``, else ``/run`` when
    writable, else the temp dir): one directory per host, shared by every server."""
    override = os.environ.get("VERLTOOL_UID_LOCK_DIR")
    if override:
        return override
    base = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
    return os.path.join(base, "verltool_jax_uids")


def uid_block() -> int:
    """The first uid of this process's block of :data:`UID_BLOCK` sandbox uids.

    Block ``k`` covers ``200000 + k*UID_BLOCK ..`` and belongs to whoever holds an exclusive
    ``flock`` on ``<lock dir>/block_<k>.lock``; the lock is held for the life of the process
    (the kernel drops it when the process ends, even by SIGKILL), so two live servers on a
    host never share a block. The search starts at a slot derived from the pid. Raises
    ``RuntimeError`` when every block is taken.
    """
    global _uid_block
    with _uid_lock:
        if _uid_block is not None and _uid_block[2] == os.getpid():
            return _uid_block[0]
        d = _uid_lock_dir()
        os.makedirs(d, mode=0o700, exist_ok=True)
        start = os.getpid() % _UID_SLOTS
        for i in range(_UID_SLOTS):
            slot = (start + i) % _UID_SLOTS
            fd = os.open(os.path.join(d, f"block_{slot}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            os.set_inheritable(fd, False)
            _uid_block = (_UID_BASE + slot * UID_BLOCK, fd, os.getpid())
            return _uid_block[0]
        raise RuntimeError(f"all {_UID_SLOTS} sandbox uid blocks are taken (lock files in {d})")


def sandbox_uid() -> int | None:
    """A fresh unprivileged uid to run sandboxed code as when the server is root
    (``None`` when not root: the code runs as the current user in a user namespace).
    Uids rotate through this server's block (:func:`uid_block`)."""
    if not _running_as_root():
        return None
    first = uid_block()
    with _uid_lock:
        return first + next(_uid_counter) % UID_BLOCK


def python_prefixes() -> list[str]:
    """Host directories holding this Python (interpreter, stdlib, venv site-packages),
    bound read-only at the same path so ``sys.executable`` works inside."""
    out: list[str] = []
    for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))):
        p = os.path.realpath(p)
        if p.startswith("/usr/") or p == "/usr":
            continue
        if p.endswith("/bin"):
            p = os.path.dirname(p)
        if not any(p == q or p.startswith(q + "/") for q in out):
            out = [q for q in out if not q.startswith(p + "/")] + [p]
    return out


def _norm_bind(b: Bind, field: str) -> tuple[str, str]:
    if isinstance(b, str):
        return b, b
    if isinstance(b, (tuple, list)) and len(b) == 2 and all(isinstance(x, str) for x in b):
        return b[0], b[1]
    raise TypeError(
        f"{field} entries must be a path or a (host_path, sandbox_path) pair, got {b!r}"
    )


def bwrap_argv(
    workdir: str | None,
    *,
    ro_binds: Iterable[Bind] = (),
    rw_binds: Iterable[Bind] = (),
    limits: ResourceLimits | None,
    network: bool = False,
    cwd: str | None = None,
    uid: int | None = None,
    env: dict[str, str] | None = None,
    workdir_dest: str = SANDBOX_WORKDIR,
    tmp_mb: int = DEFAULT_TMP_MB,
    workdir_mb: int | None = None,
) -> list[str]:
    """The argv prefix that runs a command inside the sandbox; append the command.

    ``workdir`` (a host directory; made private, 0700, and owned by the sandbox uid)
    appears at ``workdir_dest`` (default ``/workspace``) and is the only writable host
    path besides ``rw_binds``; ``workdir=None`` puts a tmpfs of ``workdir_mb`` MiB (default
    ``tmp_mb``) there instead. ``/tmp`` is a tmpfs of ``tmp_mb`` MiB and ``/var/tmp`` a
    symlink to it. ``ro_binds``/``rw_binds`` entries are a path (same inside)
    or ``(host, inside)``. ``limits`` are applied by ``prlimit`` right before the
    command (``None``: the caller applies them itself, e.g. in forked children).
    ``network=False`` gives the code a network namespace with nothing in it.
    ``uid``: when the server is root, the unprivileged uid to run as (default: a fresh
    one from :func:`sandbox_uid`). The environment is cleared and set to ``env``
    (defaults: PATH, HOME=workdir, LANG=C.UTF-8, single-threaded BLAS).

    Raises :class:`SandboxUnavailable` if there is no bwrap binary.
    """
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed; install the 'bubblewrap' "
            "package or pass --unsafe-no-sandbox (not recommended)"
        )
    if workdir is not None and (not isinstance(workdir, str) or not os.path.isdir(workdir)):
        raise ValueError(f"workdir must be an existing directory (or None), got {workdir!r}")
    for name, mb in (("tmp_mb", tmp_mb), ("workdir_mb", workdir_mb)):
        if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 1):
            raise ValueError(f"{name} must be a positive integer (MiB), got {mb!r}")
    root = _running_as_root()
    if root and uid is None:
        uid = sandbox_uid()
    if workdir is not None:
        os.chmod(workdir, 0o700)
        if root:
            assert uid is not None  # sandbox_uid() above
            os.chown(workdir, uid, uid)

    argv = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
    ]
    if not network:
        argv.append("--unshare-net")
    if not root:
        argv += ["--unshare-user", "--disable-userns"]
    # read-only system
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in _USR_LINKS:
        host = "/" + name
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    argv += ["--dir", "/etc"]
    for path in _ETC_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    if network and os.path.exists("/etc/resolv.conf"):
        argv += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    # /tmp world-writable (sticky): the sandbox uid is not its owner when root. Bounded,
    # and /var/tmp is the same file system (one budget, one place to clear).
    mib = 1024 * 1024
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(tmp_mb * mib),
        "--tmpfs",
        "/tmp",
        "--dir",
        "/var",
        "--symlink",
        "../tmp",
        "/var/tmp",
    ]
    made: set[str] = {"/", "/usr", "/etc", "/proc", "/dev", "/tmp", "/var", "/var/tmp"}

    def bind(flag: str, src: str, dst: str) -> None:
        # bwrap creates missing parents 0700, which an unprivileged uid cannot traverse
        parents = []
        parent = os.path.dirname(dst.rstrip("/"))
        while parent not in made and parent not in ("", "/"):
            parents.append(parent)
            parent = os.path.dirname(parent)
        for p in reversed(parents):
            argv.extend(["--perms", "0755", "--dir", p])
            made.add(p)
        argv.extend([flag, src, dst])
        made.add(dst)

    for prefix in python_prefixes():
        bind("--ro-bind", prefix, prefix)
    for b in ro_binds:
        bind("--ro-bind", *_norm_bind(b, "ro_binds"))
    for b in rw_binds:
        bind("--bind", *_norm_bind(b, "rw_binds"))
    if workdir is not None:
        bind("--bind", workdir, workdir_dest)
    else:
        parent = os.path.dirname(workdir_dest.rstrip("/"))
        if parent not in made and parent not in ("", "/"):
            argv.extend(["--perms", "0755", "--dir", parent])
        size = (workdir_mb or tmp_mb) * mib
        argv += ["--perms", "1777", "--size", str(size), "--tmpfs", workdir_dest]
    argv += ["--chdir", cwd or workdir_dest]
    # environment
    base_env = {
        "PATH": os.path.join(os.path.realpath(sys.prefix), "bin") + ":/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir_dest,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if env:
        base_env.update(env)
    argv.append("--clearenv")
    for k, v in base_env.items():
        argv += ["--setenv", k, v]
    if root:
        argv += [
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--",
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    else:
        argv.append("--")
    if limits is not None:
        argv += limits.prlimit_argv()
    return argv


class ProcessHandle:
    """A process to kill safely: holds a pidfd opened right after the spawn, so a kill can
    never reach an unrelated process that reused the pid after this one was reaped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except OSError:  # already gone
            self._fd = None

    def kill(self) -> None:
        """SIGKILL the process if it still exists; then forget it (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass
        finally:
            os.close(fd)


def packed_argv(argv: Sequence[str]) -> tuple[list[str], int]:
    """Move bwrap's options (everything between the binary and the first ``--``) into a
    memory file: returns ``([bwrap, "--args", FD, "--", *command], FD)``.

    The caller passes ``FD`` to the child (``pass_fds=(FD,)``) and closes it once the
    child has started; bwrap reads and closes it before running the command, so the
    sandbox's ``/proc/1/cmdline`` shows no host path. ``argv`` must come from
    :func:`bwrap_argv`.
    """
    argv = list(argv)
    try:
        split = argv.index("--")
    except ValueError:
        raise ValueError("packed_argv needs an argv from bwrap_argv (no '--' found)") from None
    options = argv[1:split]
    fd = os.memfd_create("bwrap_args", 0)
    try:
        data = b"".join(a.encode() + b"\0" for a in options)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return [argv[0], "--args", str(fd)] + argv[split:], fd


_status_lock = threading.Lock()
_status: tuple[bool, str] | None = None


def sandbox_status(refresh: bool = False) -> tuple[bool, str]:
    """``(True, "")`` if a real sandbox runs here, else ``(False, reason)``.

    Actually runs ``bwrap ... true`` (and the Python interpreter inside) once and caches
    the answer; ``refresh=True`` probes again.
    """
    global _status
    with _status_lock:
        if _status is not None and not refresh:
            return _status
        _status = _probe()
        return _status


def _probe() -> tuple[bool, str]:
    if sys.platform != "linux":
        return False, f"bubblewrap needs Linux (this is {sys.platform})"
    if bwrap_path() is None:
        return False, "bubblewrap (bwrap) not found: install the 'bubblewrap' package"
    for tool in ("prlimit",) + (("setpriv",) if _running_as_root() else ()):
        if shutil.which(tool) is None:
            return False, f"'{tool}' (util-linux) not found: install util-linux"
    with tempfile.TemporaryDirectory(prefix="sandbox_probe_") as d:
        try:
            argv, fd = packed_argv(
                bwrap_argv(d, limits=ResourceLimits(cpu_s=5, wall_s=10))
                + [os.path.basename(sys.executable), "-S", "-c", "pass"]
            )
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=20, pass_fds=(fd,))
            finally:
                os.close(fd)
        except (OSError, subprocess.SubprocessError, SandboxUnavailable) as e:
            return False, f"running bwrap failed: {e}"
        if r.returncode != 0:
            return False, (
                f"bwrap exited with {r.returncode}: {(r.stderr or r.stdout).strip()[:500]}"
            )
    return True, ""


def require_sandbox() -> None:
    """Raise :class:`SandboxUnavailable` (with the reason) unless the sandbox works."""
    ok, why = sandbox_status()
    if not ok:
        raise SandboxUnavailable(f"sandbox unavailable, refusing to run code: {why}")
