"""Append-only line files (JSONL metrics, resumable CSV tables) that survive a crash.

A process killed mid-write, or a disk that fills, can leave the last line of such a file
cut short. Appending after it would glue the next record onto the fragment, losing both
(a reader skips a line it cannot parse). :func:`open_for_append` first drops a torn last
line (the bytes after the last newline) and only then opens the file for appending, so a
resumed run loses at most the one record that was being written when it died.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)


def drop_torn_tail(path: str | os.PathLike) -> int:
    """Truncate ``path`` after its last newline; returns the bytes dropped (0 when the
    file is missing, empty or ends with a newline)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(p, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return 0
        # walk back to the last newline, a block at a time
        end, block = size, 1 << 16
        keep = 0
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            end = start
        f.truncate(keep)
    dropped = size - keep
    log.warning("%s: dropped a torn last line (%d bytes) left by a crash", p, dropped)
    return dropped


def open_for_append(path: str | os.PathLike, **kwargs) -> IO:
    """``open(path, "a", **kwargs)`` after :func:`drop_torn_tail`."""
    drop_torn_tail(path)
    return open(path, "a", **kwargs)
