"""``file_editor``: view, create and edit files in the trajectory's workspace.

Action: ``<tool_call>{"name": "file_editor", "arguments": {"command": ..., "path": ...}}</tool_call>``
(``str_replace_editor`` is accepted as an alias). Commands:

* ``view``: a file with line numbers (``view_range: [start, end]``, 1-based, inclusive,
  ``end = -1`` for the end of the file), or a directory listing two levels deep;
* ``create``: a new file with ``file_text`` (refused if the path exists);
* ``str_replace``: replace ``old_str`` by ``new_str`` (default ``""``); ``old_str`` must
  occur exactly once, otherwise nothing changes and the observation says where it occurs;
* ``insert``: insert ``new_str`` after line ``insert_line`` (0 = at the top).

Paths are relative to the workspace root (the repository copy shared with ``bash`` and
``run_tests``, see :mod:`tool_server.kit.workspace`); absolute paths are accepted only under the
workspace's sandbox path (``/workspace/...``). A path that escapes the workspace (``..``,
a symlink pointing outside, another absolute path) is refused. Files are opened component
by component with ``O_NOFOLLOW`` relative to the workspace directory, so a symlink swapped in
concurrently by the shell cannot redirect a read or write outside; a file that shares its
inode with another path is replaced by a new file rather than written through. Only regular
files are opened, non-blocking (a FIFO or device made by the shell cannot hang the server).
Files over ``file_editor_max_file_bytes`` (``--tool-opt``, default 4 MiB) are never read
whole: ``view`` streams them in bounded memory (line count, then the lines in range, up to
the observation limit) and edits are refused.
"""

from __future__ import annotations

import os
import posixpath
import stat
import uuid
from typing import Any

from tool_server.kit.base import Observation
from tool_server.kit.options import tool_option
from tool_server.kit.tool_calls import (
    ToolCall,
    ToolCallError,
    invalid_call,
    parse_tool_call_for,
    register_names,
)
from tool_server.kit.workspace import Workspace, WorkspaceError, WorkspaceTool

FILE_EDITOR_NAMES = register_names({"file_editor", "str_replace_editor"})
COMMANDS = ("view", "create", "str_replace", "insert")
SNIPPET_CONTEXT = 4
DEFAULT_MAX_FILE_BYTES = 4 << 20  # larger files are viewed in parts and never edited


class EditorError(ValueError):
    """A mistake in a file_editor call; the message is the observation."""


# --- pure text operations ------------------------------------------------------------------
def number_lines(text: str, start: int = 1) -> str:
    """``cat -n`` style: each line prefixed by its number (from ``start``) and a tab."""
    if not text:
        return ""
    lines = text.split("\n")
    if text.endswith("\n"):
        lines = lines[:-1]
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, start))


def line_count(text: str) -> int:
    """Number of lines of ``text`` (a final newline does not start a new line)."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def _check_range(view_range: Any, n: int) -> tuple[int, int]:
    """``(start, end)`` of a valid ``view_range`` for a file of ``n`` lines (``end=-1``:
    ``n``); raises :class:`EditorError` naming the bad bound."""
    if (
        not isinstance(view_range, list)
        or len(view_range) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)
    ):
        raise EditorError(
            f'"view_range" must be a list of two integers [start, end], got {view_range!r:.60}.'
        )
    start, end = view_range
    if not 1 <= start <= max(n, 1):
        raise EditorError(
            f'"view_range" start {start} must be between 1 and {n} (the number of lines).'
        )
    if end == -1:
        end = n
    if not start <= end <= n:
        raise EditorError(
            f'"view_range" end {end} must be between {start} and {n} (the '
            "number of lines), or -1 for the end of the file."
        )
    return start, end


def view_lines(text: str, view_range: list | None) -> tuple[str, int]:
    """The numbered lines ``[start, end]`` (1-based, inclusive; ``end=-1``: to the end).

    Returns ``(numbered text, start)``; raises :class:`EditorError` naming the bad bound.
    """
    n = line_count(text)
    if view_range is None:
        return number_lines(text), 1
    start, end = _check_range(view_range, n)
    lines = text.split("\n")[start - 1 : end]
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, start)), start


def replace_unique(text: str, old: str, new: str, path: str) -> tuple[str, int]:
    """``text`` with the single occurrence of ``old`` replaced by ``new``.

    Returns ``(new text, 1-based line where the replacement starts)``. Raises
    :class:`EditorError` if ``old`` is empty, absent, or occurs more than once (listing
    the lines of the occurrences).
    """
    if old == "":
        raise EditorError('"old_str" must not be empty; to add text use the insert command.')
    count = text.count(old)
    if count == 0:
        raise EditorError(
            f"No replacement was performed: old_str did not appear verbatim in "
            f"{path}. Check whitespace and indentation (view the file first)."
        )
    if count > 1:
        lines, pos = [], text.find(old)
        while pos != -1:
            lines.append(text.count("\n", 0, pos) + 1)
            pos = text.find(old, pos + 1)
        raise EditorError(
            f"No replacement was performed: old_str occurs {count} times in "
            f"{path} (lines {lines}). Include more surrounding lines to make it "
            "unique."
        )
    pos = text.find(old)
    return text[:pos] + new + text[pos + len(old) :], text.count("\n", 0, pos) + 1


def insert_after(text: str, line: object, new: str) -> str:
    """``text`` with ``new`` inserted as whole lines after line ``line`` (0: at the top).

    ``new`` is treated as a block of lines (a final newline is added if missing); a file
    without a final newline keeps lacking one when the block goes at its end.
    """
    n = line_count(text)
    if isinstance(line, bool) or not isinstance(line, int) or not 0 <= line <= n:
        raise EditorError(
            f'"insert_line" must be an integer between 0 and {n} (the number of '
            f"lines), got {line!r:.40}."
        )
    block = new if new.endswith("\n") else new + "\n"
    pos = 0
    for _ in range(line):
        nl = text.find("\n", pos)
        pos = len(text) if nl == -1 else nl + 1
    if pos == len(text) and text and not text.endswith("\n"):
        return text + "\n" + block[:-1]
    return text[:pos] + block + text[pos:]


def snippet(text: str, first_line: int, n_new_lines: int, path: str) -> str:
    """The edited region of ``text`` with :data:`SNIPPET_CONTEXT` lines around, numbered."""
    start = max(1, first_line - SNIPPET_CONTEXT)
    end = min(max(line_count(text), 1), first_line + max(n_new_lines, 1) - 1 + SNIPPET_CONTEXT)
    body, _ = view_lines(text, [start, end]) if line_count(text) else ("", 1)
    return f"Here is the result of the edit, lines {start}-{end} of {path}:\n{body}"


# --- safe file access inside a workspace ---------------------------------------------------
def workspace_relpath(ws: Workspace, path: Any) -> str:
    """The normalised path of ``path`` relative to the workspace root (symlinks resolved).

    Accepts a relative path or an absolute one under ``ws.sandbox_path``; raises
    :class:`EditorError` for anything that resolves outside the workspace.
    """
    if not isinstance(path, str) or not path.strip():
        raise EditorError('"path" must be a non-empty string (relative to the repository root).')
    if "\x00" in path:
        raise EditorError('"path" must not contain NUL characters.')
    p = path.strip()
    if p.startswith("/"):
        base = ws.sandbox_path.rstrip("/")
        if p == base or p.startswith(base + "/"):
            p = p[len(base) :].lstrip("/") or "."
        else:
            raise EditorError(
                f"path {path!r} is outside the workspace; use a path relative to the "
                f"repository root or under {ws.sandbox_path}/."
            )
    root = os.path.realpath(ws.root)
    real = os.path.realpath(os.path.join(root, p))
    if real != root and not real.startswith(root + os.sep):
        raise EditorError(
            f"path {path!r} escapes the workspace (through '..' or a symlink); "
            "only files inside the repository can be edited."
        )
    return os.path.relpath(real, root)


class _Dir:
    """A directory fd reached from the workspace root without following any symlink."""

    def __init__(self, ws: Workspace, rel_dir: str, create: bool = False) -> None:
        self.fd = os.open(ws.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in [c for c in rel_dir.split("/") if c not in ("", ".")]:
                try:
                    nfd = os.open(
                        part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd
                    )
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=self.fd)
                    if ws.uid is not None:
                        os.chown(part, ws.uid, ws.uid, dir_fd=self.fd, follow_symlinks=False)
                    nfd = os.open(
                        part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd
                    )
                os.close(self.fd)
                self.fd = nfd
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def _open_regular(ws: Workspace, rel: str) -> tuple[int, os.stat_result]:
    """An fd of the regular file ``rel`` (no symlink followed) and its stat.

    Opened with ``O_NONBLOCK`` after an ``lstat`` check, so a FIFO or a device swapped in
    by the sandboxed shell can never block the server in ``open()`` or ``read()``; the fd
    is checked again with ``fstat`` (the entry may change between the two)."""
    d, name = posixpath.split(rel)
    with _Dir(ws, d) as dfd:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise EditorError(f"{rel} is not a regular file.")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise EditorError(f"{rel} is not a regular file.")
    return fd, st


def _check_text_head(rel: str, head: bytes) -> None:
    if b"\x00" in head[:8192]:
        raise EditorError(f"{rel} looks like a binary file; file_editor edits text files only.")


def read_text(ws: Workspace, rel: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> str:
    """Read the UTF-8 text file ``rel`` of the workspace (no symlink followed; a file over
    ``max_bytes`` is refused: :func:`view_file` shows parts of larger files)."""
    fd, st = _open_regular(ws, rel)
    with os.fdopen(fd, "rb") as f:
        if st.st_size > max_bytes:
            raise EditorError(
                f"{rel} has {st.st_size} bytes, over file_editor's limit of "
                f"{max_bytes} for editing; view parts of it with view_range."
            )
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise EditorError(f"{rel} is over file_editor's limit of {max_bytes} bytes.")
    _check_text_head(rel, data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EditorError(f"{rel} is not valid UTF-8 ({e.reason} at byte {e.start}).") from None


def _stream_view(f, rel: str, view_range: list | None, max_chars: int) -> tuple[str, bool]:
    """``view_lines`` for a file too large to read whole, in bounded memory.

    Reads ``f`` in 1 MiB chunks: once to count lines (to check ``view_range`` exactly as
    :func:`view_lines` does), then again keeping only the numbered lines in range until
    the output reaches ``max_chars`` (each line cut there too). Returns
    ``(numbered text, truncated)``."""
    chunk_size = 1 << 20
    _check_text_head(rel, os.pread(f.fileno(), 8192, 0))
    n, last = 0, b"\n"
    f.seek(0)
    while True:
        chunk = f.read(chunk_size)
        if not chunk:
            break
        n += chunk.count(b"\n")
        last = chunk[-1:]
    if last != b"\n":
        n += 1
    if view_range is None:
        start, end = 1, n
    else:
        start, end = _check_range(view_range, n)
    out: list[str] = []
    used = 0
    line_no = 1
    cur = bytearray()
    f.seek(0)
    truncated = False

    def emit() -> bool:
        nonlocal used
        text = f"{line_no:6d}\t" + bytes(cur).decode("utf-8", "replace")
        out.append(text)
        used += len(text) + 1
        return used >= max_chars

    done = False
    while not done:
        chunk = f.read(chunk_size)
        if not chunk:
            if cur and start <= line_no <= end:
                truncated = emit()
            break
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            stop = len(chunk) if nl < 0 else nl
            if start <= line_no <= end and len(cur) <= max_chars:
                cur += chunk[pos : min(stop, pos + max_chars + 1 - len(cur))]
            if nl < 0:
                break
            if start <= line_no <= end and emit():
                truncated = line_no < end
                done = True
                break
            cur.clear()
            line_no += 1
            pos = nl + 1
            if line_no > end:
                done = True
                break
    return "\n".join(out), truncated


def view_file(
    ws: Workspace, rel: str, view_range: list | None, max_bytes: int, max_chars: int
) -> str:
    """The ``cat -n`` view of ``rel`` (``view_range`` as in :func:`view_lines`): read whole
    when at most ``max_bytes``, else streamed (:func:`_stream_view`) so a huge file costs
    bounded memory."""
    fd, st = _open_regular(ws, rel)
    with os.fdopen(fd, "rb") as f:
        if st.st_size <= max_bytes:
            data = f.read(max_bytes + 1)
            if len(data) <= max_bytes:
                _check_text_head(rel, data)
                text = data.decode("utf-8", "replace")
                return view_lines(text, view_range)[0]
        body, truncated = _stream_view(f, rel, view_range, max_chars)
    if truncated:
        body += "\n[... output truncated; the file is large: use view_range to see other lines ...]"
    return body


def write_text(ws: Workspace, rel: str, text: str, must_not_exist: bool = False) -> None:
    """Write ``text`` to ``rel`` (no symlink followed).

    An existing file with a single link is rewritten in place; a new file, or one that
    shares its inode with another path (a hardlink), is written as a new file renamed over
    the old one (mode kept), so a write never goes through a shared inode.
    """
    d, name = posixpath.split(rel)
    data = text.encode("utf-8")
    with _Dir(ws, d, create=must_not_exist) as dfd:
        mode = 0o644
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if must_not_exist:
                raise EditorError(
                    f"{rel} already exists; use str_replace or insert to change "
                    "it (or view it first)."
                )
            if not stat.S_ISREG(st.st_mode):
                raise EditorError(f"{rel} is not a regular file.")
            mode = stat.S_IMODE(st.st_mode)
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            with os.fdopen(fd, "r+b") as f:
                fst = os.fstat(f.fileno())
                if stat.S_ISREG(fst.st_mode) and fst.st_nlink == 1:
                    f.write(data)
                    f.truncate()
                    return
        except FileNotFoundError:
            if not must_not_exist:
                raise
        tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), mode)
                if ws.uid is not None:
                    os.fchown(f.fileno(), ws.uid, ws.uid)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise


def list_dir(ws: Workspace, rel: str, depth: int = 2, limit: int = 500) -> list[str]:
    """Non-hidden entries under directory ``rel`` up to ``depth`` levels (dirs end with /)."""
    out: list[str] = []
    with _Dir(ws, rel) as dfd:
        for top, dirs, files, _fd in os.fwalk(".", dir_fd=dfd, follow_symlinks=False):
            level = 0 if top == "." else top.count("/")
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            if level + 1 >= depth:
                out.extend(posixpath.normpath(posixpath.join(rel, top, x)) + "/" for x in dirs)
                dirs[:] = []
            else:
                out.extend(posixpath.normpath(posixpath.join(rel, top, x)) + "/" for x in dirs)
            out.extend(
                posixpath.normpath(posixpath.join(rel, top, x))
                for x in sorted(files)
                if not x.startswith(".")
            )
            if len(out) > limit:
                break
    return sorted(out)[:limit]


class FileEditorTool(WorkspaceTool):
    """View / create / str_replace / insert on files of the trajectory's workspace."""

    name = "file_editor"
    usage = (
        '<tool_call>{"name": "file_editor", "arguments": {"command": "view" | "create" | '
        '"str_replace" | "insert", "path": "relative/path", ...}}</tool_call>'
    )

    def __init__(self, settings=None) -> None:
        super().__init__(settings)
        self.max_file_bytes = tool_option(
            self.settings.extra,
            "file_editor_max_file_bytes",
            int,
            DEFAULT_MAX_FILE_BYTES,
            minimum=1024,
        )

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return parse_tool_call_for(action, FILE_EDITOR_NAMES)

    def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        if isinstance(parsed, ToolCallError):
            return invalid_call(parsed.message)
        assert isinstance(parsed, ToolCall)
        try:
            ws = self.workspace(trajectory_id, extra_field)
            text = self._run(ws, parsed.arguments)
        except (EditorError, WorkspaceError) as e:
            return invalid_call(str(e))
        except FileNotFoundError:
            msg = (
                f"{parsed.arguments.get('path')!r} does not exist (paths are relative to the "
                "repository root; use view on '.' to list files)."
            )
            return invalid_call(msg)
        except (NotADirectoryError, IsADirectoryError, PermissionError, OSError) as e:
            msg = f"file_editor could not access {parsed.arguments.get('path')!r}: {e.strerror}."
            return invalid_call(msg)
        return self._truncate(text), False, True

    def _truncate(self, text: str) -> str:
        limit = self.settings.max_obs_chars
        if len(text) <= limit:
            return text
        return (
            text[:limit] + f"\n[... output truncated at {limit} characters; use view_range "
            "to see the rest ...]"
        )

    def _run(self, ws: Workspace, args: dict) -> str:
        command = args.get("command")
        if command not in COMMANDS:
            raise EditorError(
                f'"command" must be one of {", ".join(COMMANDS)}; got {command!r:.40}.'
            )
        allowed = {
            "command",
            "path",
            "view_range",
            "file_text",
            "old_str",
            "new_str",
            "insert_line",
        }
        unknown = set(args) - allowed
        if unknown:
            raise EditorError(f"file_editor: unknown argument(s) {sorted(unknown)} for {command}.")
        rel = workspace_relpath(ws, args.get("path"))
        shown = rel
        if command == "view":
            if rel == "." or os.path.isdir(os.path.join(ws.root, rel)):
                if args.get("view_range") is not None:
                    raise EditorError('"view_range" applies to files only, not directories.')
                entries = list_dir(ws, rel)
                return (
                    f"Files and directories up to 2 levels deep in {shown} (hidden ones "
                    "excluded):\n" + "\n".join(entries)
                )
            body = view_file(
                ws, rel, args.get("view_range"), self.max_file_bytes, self.settings.max_obs_chars
            )
            return f"Here is the result of running `cat -n` on {shown}:\n{body}"
        if rel == ".":
            raise EditorError(f"{command} needs a file path, not the workspace root.")
        if command == "create":
            file_text = args.get("file_text")
            if not isinstance(file_text, str):
                raise EditorError('create needs "file_text" (a string with the file content).')
            write_text(ws, rel, file_text, must_not_exist=True)
            return f"File created successfully at {shown} ({line_count(file_text)} lines)."
        new_str = args.get("new_str", "" if command == "str_replace" else None)
        if not isinstance(new_str, str):
            raise EditorError(f'{command} needs "new_str" (a string).')
        text = read_text(ws, rel, self.max_file_bytes)
        if command == "str_replace":
            old_str = args.get("old_str")
            if not isinstance(old_str, str):
                raise EditorError(
                    'str_replace needs "old_str" (a string that occurs exactly once).'
                )
            new_text, first = replace_unique(text, old_str, new_str, shown)
            write_text(ws, rel, new_text)
            return f"The file {shown} has been edited. " + snippet(
                new_text, first, line_count(new_str) or 1, shown
            )
        line = args.get("insert_line")
        new_text = insert_after(text, line, new_str)
        assert isinstance(line, int)  # insert_after has checked it
        write_text(ws, rel, new_text)
        return f"The file {shown} has been edited. " + snippet(
            new_text, line + 1, line_count(new_str) or 1, shown
        )
