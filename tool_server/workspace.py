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
copy is ``cp -a --reflink=auto``: copy-on-write clones on file systems that support them
(btrfs, XFS, ...), a real copy elsewhere (ext4). ``tests/test_bash_tool.py`` checks that
writes in the sandbox and edits by ``file_editor`` leave the original byte-for-byte intact.

When the server runs as root the sandbox runs code as an unprivileged uid
(:func:`tool_server.sandbox.sandbox_uid`); the workspace gets one such uid for its whole
life (shell and test runs share it) and owns its tree, so files written by the host side
(``file_editor``) are handed to that uid with :meth:`Workspace.adopt`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from tool_server.sandbox import SANDBOX_WORKDIR, sandbox_uid

__all__ = ["Workspace", "WorkspaceError", "WorkspaceRegistry", "REGISTRY", "copy_tree"]


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
    source: Optional[str]
    uid: Optional[int]
    sandbox_path: str = SANDBOX_WORKDIR
    created_s: float = 0.0
    holders: set = field(default_factory=set)

    def adopt(self, path: str) -> None:
        """Give ``path`` (created by the host side) to the sandbox uid, if there is one."""
        if self.uid is not None:
            os.chown(path, self.uid, self.uid, follow_symlinks=False)


def copy_tree(src: str, dst: str) -> None:
    """Copy the contents of directory ``src`` into the new directory ``dst``.

    ``cp -a --reflink=auto``: modes, times and symlinks are preserved; data blocks are
    shared copy-on-write where the file system can, else copied. Never hardlinks.
    """
    os.makedirs(dst, exist_ok=False)
    r = subprocess.run(["cp", "-a", "--reflink=auto", "--", os.path.join(src, "."), dst],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise WorkspaceError(f"copying repo_path {src!r} failed: {r.stderr.strip()[:400]}")


def _chown_tree(root: str, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, uid, follow_symlinks=False)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


class WorkspaceRegistry:
    """Workspaces by trajectory id, shared by every tool of the server process.

    ``acquire(tid, holder, ...)`` returns the trajectory's workspace, creating it on first
    use; ``release(tid, holder)`` drops one holder and removes the directory when none is
    left. Thread-safe (tools may run in worker threads).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spaces: dict[str, Workspace] = {}

    def acquire(self, trajectory_id: str, holder: str, extra_field: Optional[dict],
                base_dir: str) -> Workspace:
        """The workspace of ``trajectory_id`` (made from ``extra_field["repo_path"]``)."""
        with self._lock:
            ws = self._spaces.get(trajectory_id)
            if ws is None:
                ws = self._create(trajectory_id, extra_field or {}, base_dir)
                self._spaces[trajectory_id] = ws
            ws.holders.add(holder)
            return ws

    def get(self, trajectory_id: str) -> Optional[Workspace]:
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
        shutil.rmtree(os.path.dirname(ws.root), ignore_errors=True)
        return True

    def active(self) -> list[str]:
        """Trajectory ids that currently have a workspace."""
        with self._lock:
            return list(self._spaces)

    @staticmethod
    def _create(trajectory_id: str, extra_field: dict, base_dir: str) -> Workspace:
        source = extra_field.get("repo_path")
        if source is not None:
            if not isinstance(source, str) or not os.path.isdir(source):
                raise WorkspaceError(f'extra_field["repo_path"] must be an existing directory, '
                                     f"got {source!r:.200}")
            source = os.path.realpath(source)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(trajectory_id))[:60]
        holder_dir = os.path.join(base_dir, "workspaces", f"{safe}-{uuid.uuid4().hex[:12]}")
        os.makedirs(holder_dir, mode=0o711)
        os.chmod(holder_dir, 0o711)
        root = os.path.join(holder_dir, "repo")
        try:
            if source is None:
                os.makedirs(root)
            else:
                copy_tree(source, root)
            uid = sandbox_uid()
            if uid is not None:
                _chown_tree(root, uid)
        except BaseException:
            shutil.rmtree(holder_dir, ignore_errors=True)
            raise
        return Workspace(trajectory_id, root, source, uid, created_s=time.time())


REGISTRY = WorkspaceRegistry()
