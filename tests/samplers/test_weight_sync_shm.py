"""Shared-memory weight segments of processes that have exited are removed (a killed
trainer never reaches SharedWeightBuffer.close)."""

from __future__ import annotations

import os
import subprocess
import sys

from verltool_jax.samplers.weight_sync import remove_orphaned_segments


def test_segments_of_exited_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    mine = os.getpid()
    for name in (
        f"verltool-w-{dead}-abcd1234-0",
        f"verltool-w-{mine}-abcd1234-0",
        "verltool-w-notapid-0",
        "other-file",
    ):
        (tmp_path / name).write_bytes(b"x" * 16)
    removed = remove_orphaned_segments(str(tmp_path))
    assert [os.path.basename(p) for p in removed] == [f"verltool-w-{dead}-abcd1234-0"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [f"verltool-w-{mine}-abcd1234-0", "verltool-w-notapid-0", "other-file"]
    )
