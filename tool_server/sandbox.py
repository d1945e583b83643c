"""Bubblewrap sandbox: argv builder, resource limits and an availability probe.

Every tool that runs model-written code (``python_code``, ``bash``) runs it under
``bwrap`` with:

* new pid, ipc, uts, cgroup and (unless ``network=True``) net namespaces, so the code
  sees only its own processes and has no network at all (not even loopback to the host);
* a read-only view of ``/usr`` (with the ``/bin``, ``/lib*``, ``/sbin`` symlinks), a
  minimal ``/etc`` and the Python installation (``sys.base_prefix`` and the venv's
  ``sys.prefix``) at their own paths; nothing else of the host: not ``/root``, not
  ``/home``, not ``/work`` or the repository;
* a private ``/tmp`` (tmpfs), a minimal ``/dev`` and a fresh ``/proc``;
* the work dir, bound at :data:`SANDBOX_WORKDIR`, as the only host path it can write;
* resource limits (:class:`ResourceLimits`) applied inside the sandbox by ``prlimit``
  just before the command, and a wall-clock limit the caller enforces.

``RLIMIT_NPROC`` is never enforced for uid 0, so when the server runs as root the
sandbox does not map a user namespace: bwrap (as root) sets up the mounts, and
``setpriv`` drops to an unprivileged uid from :func:`sandbox_uid` (all capabilities
dropped, ``no_new_privs``) before the command runs. As a normal user, bwrap creates a
user namespace and the code runs as that user.

If bubblewrap cannot be used here, :func:`require_sandbox` raises
:class:`SandboxUnavailable` and tools refuse to run code (fail closed).

Usage::

    ok, why = sandbox_status()
    argv = bwrap_argv(workdir, limits=ResourceLimits(cpu_s=5, wall_s=5)) + ["python3", "-c", code]
    subprocess.run(argv, timeout=limits.wall_s, ...)
"""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union

__all__ = [
    "SANDBOX_WORKDIR", "ResourceLimits", "SandboxUnavailable", "sandbox_status",
    "require_sandbox", "bwrap_argv", "sandbox_uid", "python_prefixes", "bwrap_path",
]

# Where the work dir appears inside the sandbox (also the default cwd and $HOME).
SANDBOX_WORKDIR = "/workspace"

# Unprivileged uids used when the server runs as root (one per sandbox, rotating, so
# that RLIMIT_NPROC, which counts processes per uid, does not couple two sandboxes).
_UID_BASE = 200_000
_UID_RANGE = 50_000
_uid_counter = itertools.count()
_uid_lock = threading.Lock()

# Host files of /etc a program may need (dynamic loader, locale, users, alternatives).
_ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
    "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/alternatives",
    "/etc/mime.types", "/etc/ssl/certs",
)
_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

Bind = Union[str, tuple[str, str]]


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
    """

    cpu_s: int = 10
    memory_mb: int = 1024
    nproc: int = 64
    nofile: int = 256
    fsize_mb: int = 64
    wall_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("cpu_s", "memory_mb", "nproc", "nofile", "fsize_mb", "wall_s"):
            value = getattr(self, name)
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
            "prlimit", f"--cpu={cpu}:{cpu + 1}", f"--as={self.memory_mb * mib}",
            f"--nproc={self.nproc}", f"--nofile={self.nofile}",
            f"--fsize={self.fsize_mb * mib}", "--core=0", "--",
        ]


def bwrap_path() -> Optional[str]:
    """The bubblewrap binary (``$VERLTOOL_BWRAP`` overrides; tests point it at a
    missing file to exercise the fail-closed path)."""
    override = os.environ.get("VERLTOOL_BWRAP")
    if override is not None:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("bwrap")


def _running_as_root() -> bool:
    return os.geteuid() == 0


def sandbox_uid() -> Optional[int]:
    """A fresh unprivileged uid to run sandboxed code as when the server is root
    (``None`` when not root: the code runs as the current user in a user namespace)."""
    if not _running_as_root():
        return None
    with _uid_lock:
        return _UID_BASE + next(_uid_counter) % _UID_RANGE


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
    raise TypeError(f"{field} entries must be a path or a (host_path, sandbox_path) pair, got {b!r}")


def bwrap_argv(workdir: str, *, ro_binds: Iterable[Bind] = (), rw_binds: Iterable[Bind] = (),
               limits: Optional[ResourceLimits], network: bool = False,
               cwd: Optional[str] = None, uid: Optional[int] = None,
               env: Optional[dict[str, str]] = None, workdir_dest: str = SANDBOX_WORKDIR
               ) -> list[str]:
    """The argv prefix that runs a command inside the sandbox; append the command.

    ``workdir`` (a host directory; made private, 0700, and owned by the sandbox uid)
    appears at ``workdir_dest`` (default ``/workspace``) and is the only writable host
    path besides ``rw_binds``. ``ro_binds``/``rw_binds`` entries are a path (same inside)
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
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed; install the 'bubblewrap' "
                                 "package or pass --unsafe-no-sandbox (not recommended)")
    if not isinstance(workdir, str) or not os.path.isdir(workdir):
        raise ValueError(f"workdir must be an existing directory, got {workdir!r}")
    root = _running_as_root()
    if root and uid is None:
        uid = sandbox_uid()
    os.chmod(workdir, 0o700)
    if root:
        os.chown(workdir, uid, uid)

    argv = [bwrap, "--die-with-parent", "--new-session",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox"]
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
    # /tmp and /var/tmp world-writable (sticky): the sandbox uid is not their owner when root
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
             "--perms", "1777", "--dir", "/var/tmp"]
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
    bind("--bind", workdir, workdir_dest)
    argv += ["--chdir", cwd or workdir_dest]
    # environment
    base_env = {
        "PATH": os.path.join(sys.prefix, "bin") + ":/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir_dest, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if env:
        base_env.update(env)
    argv.append("--clearenv")
    for k, v in base_env.items():
        argv += ["--setenv", k, v]
    if root:
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                 "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    else:
        argv.append("--")
    if limits is not None:
        argv += limits.prlimit_argv()
    return argv


_status_lock = threading.Lock()
_status: Optional[tuple[bool, str]] = None


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
            argv = bwrap_argv(d, limits=ResourceLimits(cpu_s=5, wall_s=10))
            r = subprocess.run(argv + [sys.executable, "-S", "-c", "pass"],
                               capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError, SandboxUnavailable) as e:
            return False, f"running bwrap failed: {e}"
        if r.returncode != 0:
            return False, (f"bwrap exited with {r.returncode}: "
                           f"{(r.stderr or r.stdout).strip()[:500]}")
    return True, ""


def require_sandbox() -> None:
    """Raise :class:`SandboxUnavailable` (with the reason) unless the sandbox works."""
    ok, why = sandbox_status()
    if not ok:
        raise SandboxUnavailable(f"sandbox unavailable, refusing to run code: {why}")
