"""A full disk (verltool_jax/train/disk.py) on a real small filesystem: a tmpfs as
``trainer.out_dir`` (mounting one needs root; skipped otherwise).

* the disk fills in the middle of a run (a file takes every free byte once step 2 is
  saved): the run stops with exit 4 and says so, its last complete checkpoint is intact,
  and once space is freed the same command resumes from it;
* a disk too small for one checkpoint: the run refuses at the start with the estimate.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.smoke_run import smoke_train_flags

from verltool_jax.train.__main__ import EXIT_DISK_FULL
from verltool_jax.train.checkpoint import MARKER, latest_complete_step
from verltool_jax.train.disk import DiskFull, is_disk_full, needed_bytes, require_free_space

REPO = Path(__file__).resolve().parents[2]


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)])
    if r.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)])


def _argv(out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "verltool_jax.train", *smoke_train_flags(out, steps)]


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until the disk is full."""
    block = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)


needs_root = pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root")


@pytest.mark.slow  # ~2 min: a tiny run until a 32 MiB tmpfs is full, then its resume
@needs_root
def test_a_disk_that_fills_mid_run_stops_it_with_exit_4_and_the_checkpoint_resumes(tmp_path):
    with tmpfs(tmp_path / "disk", "32m") as disk:
        out = disk / "run"
        proc = subprocess.Popen(
            _argv(out, 50), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 600
        while not (out / "checkpoints" / "2" / MARKER).exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        _fill(disk / "filler")
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == EXIT_DISK_FULL == 4, stderr[-3000:]
        assert f"the disk holding {out} is full" in stderr, stderr[-3000:]
        assert "No space left on device" in stderr
        kept = latest_complete_step(out / "checkpoints")
        assert kept is not None and kept >= 2
        assert f"the last complete checkpoint, step {kept} in" in stderr
        (disk / "filler").unlink()
        r = subprocess.run(_argv(out, kept + 1), cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"at step {kept}" in r.stdout and "rejected" not in r.stdout, r.stdout


@needs_root
def test_a_disk_too_small_for_one_checkpoint_is_refused_at_the_start(tmp_path):
    with tmpfs(tmp_path / "disk", "3m") as disk:
        out = disk / "run"
        r = subprocess.run(_argv(out, 2), cwd=REPO, capture_output=True, text=True)
        assert not (out / "checkpoints" / "1").exists()
    assert r.returncode == EXIT_DISK_FULL, r.stderr[-3000:]
    assert "refused to start: not enough free space for one checkpoint" in r.stderr, r.stderr
    assert "a checkpoint of this model takes about" in r.stderr and "MiB is free" in r.stderr


def test_the_estimate_and_the_cause_chain(tmp_path):
    require_free_space(tmp_path, 1 << 20)  # a megabyte fits here
    with pytest.raises(DiskFull, match="about 1048576.0 MiB"):
        require_free_space(tmp_path / "not" / "yet", 1 << 40)
    assert needed_bytes(100 << 20) > 105 << 20
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("a save failed in the background") from e
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert is_disk_full(ValueError("tensorstore: No space left on device [OS error 28]"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
