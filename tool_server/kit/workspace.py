"""Per-trajectory workspaces shared by the software-engineering tools.

``bash``, ``file_editor`` and ``run_tests`` of one trajectory work on the same directory:
a private copy of the repository named in ``extra_field["repo_path"]`` (an empty directory
when there is none). The module-level :data:`REGISTRY` hands it out by trajectory id and
reference-counts the tools holding it; the directory is removed when the last holder
releases it (trajectory finished, or each tool's state TTL expired).

How the copy is made, and why not with plain hardlinks: the sandboxed shell must never
change the original repository. A hardlink shares the inode, so an in-place write
(``echo >> f``, ``open(f, "w")``) through the link changes the original file, and making
the workspace writable for the sandbox uid would mean chown-ing the shared inode. So the
working tree is copied with ``cp -a --reflink=auto``: copy-on-write clones on file systems
that support them (btrfs, XFS, ...), a real copy elsewhere (ext4; put ``--workdir`` on a
tmpfs to make that cheap, see ``benchmarks/workspace_tools_throughput.py``).

The one exception is git's object store (``.git/objects``, usually most of a repository's
bytes): its files are immutable by design (git writes new objects to new files and renames
them) and read-only. When the server runs as root the sandbox runs code as an unprivileged
uid (:func:`tool_server.sandbox.sandbox_uid`) that neither owns nor can write those files,
nor chmod them; so they are hardlinked, owned by the original owner, while their
directories are new and belong to the sandbox uid (git can add objects; deleting a link
only removes the workspace's name). A file of the store that the sandbox uid could write
(group/other-writable, or owned by it) is copied instead. Without root (user namespace,
the code runs as the file owner) everything is copied. ``tests/test_bash_tool.py`` checks
that writes in the sandbox and edits by ``file_editor`` leave the original byte-for-byte
intact, ``.git`` included.

The workspace gets one sandbox uid for its whole life (shell and test runs share it) and
that uid owns the tree; files written by the host side (``file_editor``) are handed to it
(:meth:`Workspace.adopt`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

from tool_server.kit.base import BaseTool
from tool_server.sandbox import SANDBOX_WORKDIR, sandbox_uid

__all__ = [
    "Workspace",
    "WorkspaceError",
    "WorkspaceRegistry",
    "REGISTRY",
    "WorkspaceTool",
    "copy_tree",
]


class WorkspaceError(ValueError):
    """The workspace cannot be made (bad ``repo_path``, copy failure); the message says why."""


@dataclass
class Workspace:
    """One trajectory's working copy.

    ``root`` is the host directory (what ``file_editor`` edits), visible inside the sandbox
    at ``sandbox_path``; ``uid`` is the sandbox uid that owns it (``None`` when the server
    is not root: then the sandbox runs as the current user in a user namespace).
    """

    trajectory_id: str
    root: str
    source: str | None
    uid: int | None
    sandbox_path: str = SANDBOX_WORKDIR
    created_s: float = 0.0
    holders: set = field(default_factory=set)

    def adopt(self, path: str) -> None:
        """Give ``path`` (created by the host side) to the sandbox uid, if there is one."""
        if self.uid is not None:
            os.chown(path, self.uid, self.uid, follow_symlinks=False)


def _cp(args: list[str], src: str) -> None:
    r = subprocess.run(["cp", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise WorkspaceError(f"copying repo_path {src!r} failed: {r.stderr.strip()[:400]}")


GIT_OBJECTS = os.path.join(".git", "objects")


def copy_tree(src: str, dst: str, link_git_objects_for_uid: int | None = None) -> list[str]:
    """Copy the contents of directory ``src`` into the new directory ``dst``.

    ``cp -a --reflink=auto``: modes, times and symlinks are preserved; data blocks are shared
    copy-on-write where the file system can, else copied. If ``link_git_objects_for_uid``
    is given, the files of ``.git/objects`` are hardlinked instead, except those that uid
    could write (see the module docstring). Returns the hardlinked paths (relative).
    """
    objects = os.path.join(src, GIT_OBJECTS)
    link = (
        link_git_objects_for_uid is not None
        and os.path.isdir(objects)
        and not os.path.islink(os.path.join(src, ".git"))
        and not os.path.islink(objects)
    )
    os.makedirs(dst, exist_ok=False)
    if not link:
        _cp(["-a", "--reflink=auto", "--", os.path.join(src, "."), dst], src)
        return []
    top = [os.path.join(src, e) for e in os.listdir(src) if e != ".git"]
    git = [
        os.path.join(src, ".git", e)
        for e in os.listdir(os.path.join(src, ".git"))
        if e != "objects"
    ]
    if top:
        _cp(["-a", "--reflink=auto", "--", *top, dst], src)
    os.makedirs(os.path.join(dst, ".git"))
    shutil.copystat(os.path.join(src, ".git"), os.path.join(dst, ".git"))
    if git:
        _cp(["-a", "--reflink=auto", "--", *git, os.path.join(dst, ".git")], src)
    try:
        _cp(["-al", "--", objects, os.path.join(dst, ".git")], src)
    except WorkspaceError:  # e.g. the work dir is on another file system: copy instead
        shutil.rmtree(os.path.join(dst, GIT_OBJECTS), ignore_errors=True)
        _cp(["-a", "--reflink=auto", "--", objects, os.path.join(dst, ".git")], src)
        return []
    linked = []
    for dirpath, _dirs, files in os.walk(os.path.join(dst, GIT_OBJECTS)):
        for name in files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if not os.path.isfile(p) or os.path.islink(p):
                continue
            if st.st_mode & 0o022 or st.st_uid == link_git_objects_for_uid:
                tmp = p + ".copy"
                shutil.copy2(p, tmp)
                os.replace(tmp, p)  # a private copy instead of the shared inode
            else:
                linked.append(os.path.relpath(p, dst))
    return linked


def _chown_tree(root: str, uid: int, skip: set) -> None:
    """Give every entry under ``root`` to ``uid``, except the (hardlinked) paths in ``skip``."""
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, uid, follow_symlinks=False)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            if os.path.relpath(p, root) not in skip:
                os.chown(p, uid, uid, follow_symlinks=False)


class WorkspaceRegistry:
    """Workspaces by trajectory id, shared by every tool of the server process.

    ``acquire(tid, holder, ...)`` returns the trajectory's workspace, creating it on first
    use (trajectories are created concurrently; two tools of one trajectory get the same
    one); ``release(tid, holder)`` drops one holder and, when none is left, moves the
    directory into ``<base_dir>/trash`` (one rename) and deletes it in a background thread,
    so freeing never blocks the server. :meth:`drain` waits for pending deletions.
    Thread-safe (tools may run in worker threads); ``acquire`` blocks while copying, so
    async callers run it in a thread (:meth:`acquire_async`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spaces: dict[str, Workspace] = {}
        self._creating: dict[str, threading.Lock] = {}
        self._deleters: set[threading.Thread] = set()

    def acquire(
        self, trajectory_id: str, holder: str, extra_field: dict | None, base_dir: str
    ) -> Workspace:
        """The workspace of ``trajectory_id`` (made from ``extra_field["repo_path"]``)."""
        with self._lock:
            ws = self._spaces.get(trajectory_id)
            if ws is not None:
                ws.holders.add(holder)
                return ws
            creating = self._creating.setdefault(trajectory_id, threading.Lock())
        with creating:
            with self._lock:
                ws = self._spaces.get(trajectory_id)
                if ws is not None:
                    ws.holders.add(holder)
                    return ws
            try:
                ws = self._create(trajectory_id, extra_field or {}, base_dir)
            finally:
                with self._lock:
                    self._creating.pop(trajectory_id, None)
            with self._lock:
                self._spaces[trajectory_id] = ws
                ws.holders.add(holder)
            return ws

    async def acquire_async(
        self, trajectory_id: str, holder: str, extra_field: dict | None, base_dir: str
    ) -> Workspace:
        """:meth:`acquire` in a worker thread (the copy must not block the event loop)."""
        import asyncio

        return await asyncio.to_thread(self.acquire, trajectory_id, holder, extra_field, base_dir)

    def get(self, trajectory_id: str) -> Workspace | None:
        with self._lock:
            return self._spaces.get(trajectory_id)

    def release(self, trajectory_id: str, holder: str) -> bool:
        """Drop ``holder``; remove the workspace if it was the last. True if removed."""
        with self._lock:
            ws = self._spaces.get(trajectory_id)
            if ws is None:
                return False
            ws.holders.discard(holder)
            if ws.holders:
                return False
            del self._spaces[trajectory_id]
        holder_dir = os.path.dirname(ws.root)
        trash = os.path.join(os.path.dirname(os.path.dirname(holder_dir)), "trash")
        try:
            os.makedirs(trash, exist_ok=True)
            doomed = os.path.join(trash, os.path.basename(holder_dir))
            os.rename(holder_dir, doomed)
        except OSError:
            doomed = holder_dir
        t = threading.Thread(target=self._delete, args=(doomed,), daemon=True, name="workspace-rm")
        with self._lock:
            self._deleters.add(t)
        t.start()
        return True

    def _delete(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)
        with self._lock:
            self._deleters.discard(threading.current_thread())

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every released workspace is deleted from disk."""
        with self._lock:
            pending = list(self._deleters)
        for t in pending:
            t.join(timeout)

    def active(self) -> list[str]:
        """Trajectory ids that currently have a workspace."""
        with self._lock:
            return list(self._spaces)

    @staticmethod
    def _create(trajectory_id: str, extra_field: dict, base_dir: str) -> Workspace:
        source = extra_field.get("repo_path")
        if source is not None:
            if not isinstance(source, str) or not os.path.isdir(source):
                raise WorkspaceError(
                    f'extra_field["repo_path"] must be an existing directory, got {source!r:.200}'
                )
            source = os.path.realpath(source)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(trajectory_id))[:60]
        holder_dir = os.path.join(base_dir, "workspaces", f"{safe}-{uuid.uuid4().hex[:12]}")
        os.makedirs(holder_dir, mode=0o711)
        os.chmod(holder_dir, 0o711)
        root = os.path.join(holder_dir, "repo")
        try:
            uid = sandbox_uid()
            linked: list[str] = []
            if source is None:
                os.makedirs(root)
            else:
                linked = copy_tree(source, root, link_git_objects_for_uid=uid)
            if uid is not None:
                _chown_tree(root, uid, set(linked))
        except BaseException:
            shutil.rmtree(holder_dir, ignore_errors=True)
            raise
        return Workspace(trajectory_id, root, source, uid, created_s=time.time())


REGISTRY = WorkspaceRegistry()


class WorkspaceTool(BaseTool):
    """Base of the tools that work in the trajectory's workspace (``bash``,
    ``file_editor``, ``run_tests``): acquiring it marks the tool as a holder, freeing the
    trajectory releases it, and server shutdown waits for the deletions."""

    def keeps_state(self, extra_field: dict) -> bool:
        return True  # the workspace (and bash's shell)

    def workspace(self, trajectory_id: str, extra_field: dict | None) -> Workspace:
        """The trajectory's workspace, from a worker thread (blocks while copying)."""
        ws = REGISTRY.acquire(trajectory_id, self.name, extra_field, self.settings.workdir)
        self.load_env(trajectory_id)["workspace"] = True
        return ws

    async def workspace_async(self, trajectory_id: str, extra_field: dict | None) -> Workspace:
        """:meth:`workspace` for ``async`` tools: the copy runs in a thread."""
        ws = await REGISTRY.acquire_async(
            trajectory_id, self.name, extra_field, self.settings.workdir
        )
        self.load_env(trajectory_id)["workspace"] = True
        return ws

    def on_delete(self, trajectory_id: str, env: dict) -> None:
        if env.get("workspace"):
            REGISTRY.release(trajectory_id, self.name)

    def close(self) -> None:
        super().close()
        REGISTRY.drain(timeout=60)
