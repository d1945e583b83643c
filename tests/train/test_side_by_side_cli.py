"""benchmarks/trl_side_by_side.py's options for an A/B of our settings: ``--ours-set``
reaches our trainer's config, ``--sides ours`` prints a table without the ratio, and bad
values are refused by name."""

from __future__ import annotations

import subprocess
import sys

from support.experiment_scripts import REPO as ROOT
from support.experiment_scripts import load_script

SCRIPT = ROOT / "benchmarks" / "trl_side_by_side.py"


def _module():
    return load_script("benchmarks", "trl_side_by_side")


def test_ours_set_reaches_the_config_last(tmp_path):
    from verltool_jax.cli import parse_command_line

    mod = _module()
    argv = mod.our_argv(str(tmp_path), 3, str(tmp_path / "out"), ("sampler.lora_sync=adapter",))
    rc = parse_command_line(argv).config
    assert rc.sampler.lora_sync == "adapter" and rc.trainer.steps == 3
    assert rc.model.lora_rank == mod.LORA_RANK
    argv = mod.our_argv(str(tmp_path), 3, str(tmp_path / "out"), ("trainer.steps=5",))
    assert parse_command_line(argv).config.trainer.steps == 5  # over the benchmark's own


def test_one_side_table_has_no_ratio(tmp_path, capsys):
    mod = _module()
    run = {
        "startup": 40.0,
        "steps": [{"step": 90.0, "generation": 30.0, "train": 50.0}]
        + [{"step": 60.0, "generation": 10.0, "train": 45.0}] * 2,
        "peak_rss": 2**33,
        "tokens": 200.0,
        "tool_calls": 0.5,
    }
    mod.print_table({"ours": [run]}, tmp_path, "load average 1.0-1.2")
    out = capsys.readouterr().out
    assert "ours" in out and "60.0s" in out and "TRL steady step" not in out


def test_bad_sides_and_settings_are_refused():
    for extra, says in (
        (["--sides", "ours,vllm"], "--sides"),
        (["--ours-set", "sampler.lora_sync"], "KEY=VALUE"),
    ):
        r = subprocess.run(
            [sys.executable, str(SCRIPT), "--data-dir", "nowhere", *extra],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert r.returncode == 2 and says in r.stderr, r.stderr
