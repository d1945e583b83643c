"""Crash-consistent checkpoints (verltool_jax/train/checkpoint.py): a process killed at
random moments while it saves (N >= 20 kills) never leaves a step that resume loads
partly; a newest step with a truncated, changed or missing file, or without its
completeness marker, is named, moved aside, and the previous complete step is restored."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.ckpt_saver import check, state_at
from support.smoke_run import smoke_train_flags

from verltool_jax.train.checkpoint import (
    MARKER,
    REJECTED_DIR,
    TMP_SUFFIX,
    UNCHECKED,
    Checkpointer,
)

REPO = Path(__file__).resolve().parents[2]

N_KILLS = 20


def _saver(directory: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests/support/ckpt_saver.py"), str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )


def test_kills_at_random_moments_of_saves_never_leave_a_partial_state(tmp_path):
    rng = random.Random(0)
    directory = tmp_path / "ck"
    mid_save = resumed = 0
    last_step = 0
    for trial in range(N_KILLS + 1):
        proc = _saver(directory)
        report = json.loads(proc.stdout.readline())
        # every start after a kill is a resume: exactly one saved state, never older
        # than the last step that was complete before the kill
        assert report["bad"] is None, report
        assert report["rejected"] == [], report  # a step is published only when sealed
        if trial:
            assert report["resumed"] is not None and report["resumed"] >= last_step
            resumed += 1
        if trial == N_KILLS:
            proc.kill()
            proc.wait()
            break
        assert proc.stdout.readline().startswith("saving")
        time.sleep(rng.uniform(0.0, 1.5))
        in_progress = any(p.name.endswith(TMP_SUFFIX) for p in directory.iterdir())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        mid_save += in_progress
        sealed = [int(p.name) for p in directory.iterdir() if p.name.isdigit()]
        last_step = max(sealed, default=0)
    print(
        f"\n[crash test] {N_KILLS} kills during saves, {mid_save} with a step half written; "
        f"{resumed} resumes, each from one complete saved state"
    )
    assert mid_save >= N_KILLS // 4  # the kills did land inside saves


def _saved(directory: Path, steps=(1, 2, 3)) -> None:
    with Checkpointer(directory, keep=len(steps)) as ck:
        for s in steps:
            ck.maybe_save(state_at(s), {"pos": s})


def _largest_file(step_dir: Path) -> Path:
    """The largest array file of a step (not the marker or orbax's commit notes)."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.name not in UNCHECKED]
    return max(files, key=lambda p: p.stat().st_size)


def _restore(directory: Path):
    ck = Checkpointer(directory, keep=3)
    try:
        state, data = ck.restore(state_at(0))
        return ck, state, data
    finally:
        ck.close()


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "no_marker"])
def test_a_damaged_newest_step_is_named_and_the_previous_one_restored(tmp_path, damage):
    directory = tmp_path / "ck"
    _saved(directory)
    victim = _largest_file(directory / "3")
    if damage == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(victim.stat().st_size // 2)
        why = "truncated"
    elif damage == "flip":
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
        why = "corrupted"
    elif damage == "delete":
        victim.unlink()
        why = "missing"
    else:
        (directory / "3" / MARKER).unlink()
        why = "no completeness marker"
    ck, state, data = _restore(directory)
    assert [r.step for r in ck.rejected] == [3]
    message = ck.rejected[0].describe()
    assert "checkpoint step 3" in message and why in message, message
    if damage != "no_marker":
        assert str(victim) in message  # the file is named
    assert check(state, data, 2) is None and int(state.step) == 2
    moved = list((directory / REJECTED_DIR).iterdir())
    assert [p.name.split(".")[0] for p in moved] == ["3"] and not (directory / "3").exists()
    # the next save of step 3 works (orbax does not trip over the rejected folder)
    with Checkpointer(directory, keep=3) as ck2:
        assert ck2.rejected == [] and ck2.all_steps() == [1, 2]
        ck2.maybe_save(state_at(3), {"pos": 3})
        ck2.wait()
        assert ck2.all_steps() == [1, 2, 3]


def test_two_damaged_steps_fall_back_two_and_all_damaged_start_afresh(tmp_path):
    directory = tmp_path / "ck"
    _saved(directory)
    for s in (3, 2):
        with open(_largest_file(directory / str(s)), "r+b") as f:
            f.truncate(1)
    ck, state, _ = _restore(directory)
    assert [r.step for r in ck.rejected] == [3, 2] and int(state.step) == 1
    with open(_largest_file(directory / "1"), "r+b") as f:
        f.truncate(1)
    ck = Checkpointer(directory)
    assert [r.step for r in ck.rejected] == [1] and ck.latest_step() is None
    ck.close()


def test_a_directory_saved_before_markers_is_trusted(tmp_path):
    directory = tmp_path / "ck"
    _saved(directory)
    for p in directory.glob(f"*/{MARKER}"):
        p.unlink()
    ck, state, data = _restore(directory)
    assert ck.rejected == [] and check(state, data, 3) is None


def test_the_marker_lists_every_file_with_size_and_sha256(tmp_path):
    directory = tmp_path / "ck"
    _saved(directory, steps=(1,))
    marker = json.loads((directory / "1" / MARKER).read_text())
    files = {
        str(p.relative_to(directory / "1"))
        for p in (directory / "1").rglob("*")
        if p.is_file() and p.name not in (MARKER, "_CHECKPOINT_METADATA", "commit_success.txt")
    }
    assert marker["step"] == 1 and set(marker["files"]) == files
    assert all(len(v["sha256"]) == 64 and v["size"] >= 0 for v in marker["files"].values())
    assert not list(directory.glob(f"1/{MARKER}.tmp"))


def test_the_trainer_says_which_checkpoint_it_rejected_and_resumes_before_it(tmp_path, capfd):
    from verltool_jax.train.__main__ import main

    out = tmp_path / "run"
    assert main(smoke_train_flags(out, 2)) == 0
    ckpts = out / "checkpoints"
    assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == [1, 2]
    victim = _largest_file(ckpts / "2")
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size - 1)
    capfd.readouterr()
    assert main(smoke_train_flags(out, 3)) == 0
    console = capfd.readouterr().out
    assert f"checkpoint step 2 is unusable: file {victim} is truncated" in console, console
    assert "at step 1, the newest complete checkpoint" in console, console
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and not summary["interrupted"]
