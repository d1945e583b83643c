"""Nothing dropped: the data accounting of real runs (tiny_math smoke config, the JAX
sampler, the real tool server and trainer). A batch the health check skips and a group
the queue drops as too stale (both forced) have their prompts rolled out again and
trained later; a run resumed in the middle continues the accounting. Each run's summary
says exact, and the trajectories it trained on (``logging.dump_trajectories``) confirm it
independently: every prompt trained once, none twice, none lost."""

from __future__ import annotations

import json
import re
from pathlib import Path

from verltool_jax.cli import parse_command_line
from verltool_jax.rollout import queue as queue_mod
from verltool_jax.rollout.trajectory import load_trajectories
from verltool_jax.train import trainer as trainer_mod
from verltool_jax.train.health import HealthMonitor

REPO = Path(__file__).resolve().parents[2]


def _config(out: Path, steps: int):
    argv = [
        "--config",
        str(REPO / "configs/tiny_math.py") + ":smoke",
        "--config.sampler.backend=jax",
        "--config.sft.steps=0",
        f"--config.trainer.out_dir={out}",
        f"--config.trainer.steps={steps}",
        "--config.trainer.ckpt_every=0",
        "--config.logging.progress_bar=false",
        "--config.logging.plot=false",
        "--config.logging.tensorboard=false",
        "--config.logging.dump_trajectories=true",
        "--config.data.max_eval_examples=0",
    ]
    return parse_command_line(argv).config


def _row(gid: str) -> int:
    """The data row of a group id (``s3-17``, ``r5-17``, ``s3-17.a1`` -> 17)."""
    m = re.fullmatch(r"[sr]\d+-(\d+)(\.a\d+)?", gid)
    assert m, gid
    return int(m.group(1))


def _trained_gids(out: Path) -> list[str]:
    gids = []
    for path in sorted((out / "trained").glob("step_*.jsonl")):
        gids += sorted({t.group_id for t in load_trajectories(path)})
    return gids


def _final_data(out: Path) -> dict:
    step = max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    return json.loads((out / "checkpoints" / str(step) / "data" / "metadata").read_text())


def _check_independently(out: Path, data: dict) -> list[int]:
    """From the trained trajectories and the final checkpoint alone: rows trained once
    (the 32-row stream does not wrap in these runs), none also in flight, and trained +
    in flight = every prompt the pipeline handed out. Returns the trained rows."""
    rows = [_row(g) for g in _trained_gids(out)]
    saved = _final_data(out)
    flight = [key for _, key in saved["replay"]]
    assert len(rows) == len(set(rows)) == data["trained"], rows
    assert not set(rows) & set(flight)
    assert len(rows) + len(flight) == saved["prompts"]["consumed"] == data["drawn"]
    return rows


def test_skipped_and_stale_prompts_are_trained_later_and_a_resume_stays_exact(
    tmp_path, monkeypatch
):
    out = tmp_path / "run"
    skipped: list[str] = []
    orig_admit = HealthMonitor.admit

    async def admit(self, trajs, step):
        if step == 1 and not skipped:  # the second batch: refused (as if it had failed)
            skipped.extend(sorted({t.group_id for t in trajs}))
            return False
        return await orig_admit(self, trajs, step)

    stale: list[str] = []
    orig_staleness = queue_mod.staleness

    def staleness(version, group):  # the first group waiting after step 1: too stale
        if version >= 1 and not stale:
            stale.append(group[0].group_id)
        return 99 if group[0].group_id in stale else orig_staleness(version, group)

    monkeypatch.setattr(HealthMonitor, "admit", admit)
    monkeypatch.setattr(queue_mod, "staleness", staleness)
    result = trainer_mod.train(_config(out, steps=3), echo=False)

    data = json.loads((out / "summary.json").read_text())["data"]
    assert data == result.summary.data and data["ok"], data
    assert data["trained"] == 6 and data["no_signal"] == 0 and not data["lost"]
    assert data["in_flight"] > 0  # rollout runs ahead: saved for the next run
    assert data["given_back"] == {"skipped": 2, "failed": 0, "stale": 1}
    assert "; data exact: 6 prompts trained once, 0 no-signal" in result.summary.last_line(out)
    _check_independently(out, data)
    # the refused batch and the stale group: not trained as they were, rolled out again
    # (trained since, or in flight)
    gids, flight = _trained_gids(out), [key for _, key in _final_data(out)["replay"]]
    assert len(skipped) == 2 and len(stale) == 1
    for gid in skipped + stale:
        assert gid not in gids and (f"{gid}.a1" in gids or _row(gid) in flight)

    # resumed in the middle: the accounting goes on from the checkpoint, still exact
    monkeypatch.undo()
    replay, kept = _final_data(out)["replay"], {r["gid"] for r in _final_data(out)["rollouts"]}
    second = trainer_mod.train(_config(out, steps=5), echo=False).summary.data
    assert second["ok"] and second["trained"] == 10, second
    assert second["given_back"]["skipped"] == 2 and second["drawn"] > data["drawn"]
    rows = _check_independently(out, second)
    assert all(_row(gid) in rows for gid in skipped + stale)
    # the prompts in flight at the checkpoint were trained: gone on with under their group
    # id (the trajectories the checkpoint kept) or rolled out again (``r<serial>-``)
    trained_after = [
        g for g in _trained_gids(out) if g[0] == "r" or g in kept or g.rsplit(".a", 1)[0] in kept
    ]
    assert sorted(_row(g) for g in trained_after) == sorted(key for _, key in replay)
