"""The example third-party package ``examples/plugin_package`` (vtj-letter-count),
installed with pip into a folder of its own, offline, and used without touching this
repository's code: discovered and listed, its tool served by a real tool server, its
task and reward checked, and (slow) a tiny training run of its own config, in a
subprocess whose only link to the package is ``PYTHONPATH``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.plugins import forget_modules

from tool_server.launcher import ToolServerProcess, post_json

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "plugin_package"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """``pip install --no-deps --no-build-isolation --no-index -t SITE`` of a copy of the
    example (a copy: the build writes build/ and *.egg-info next to the sources)."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = tmp / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = tmp / "site"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-t", str(target), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (target / "vtj_letter_count-0.1.0.dist-info" / "entry_points.txt").is_file()
    return target


def _env(site: Path) -> dict:
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}


def _run(site: Path, *argv: str, cwd: Path = REPO, timeout: float = 120):
    out = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=cwd, env=_env(site),
        timeout=timeout,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_the_installed_package_is_listed_with_its_name(site):
    source = "package vtj-letter-count 0.1.0"
    tools = _run(site, "-m", "tool_server", "--list-tools").splitlines()
    assert any(x.split()[0] == "letter_count" and source in x for x in tools[1:])
    listing = _run(site, "-m", "verltool_jax.plugins").split("\n\n")
    tasks, rewards, tools = (t.splitlines() for t in listing)
    for table in (tasks, rewards, tools):
        (row,) = [x for x in table if x.split()[0] == "letter_count"]
        assert source in row and "UNUSABLE" not in row
    assert any(x.split()[0] == "tiny_math" and "built-in" in x for x in tasks)


def test_the_package_tool_in_a_real_server(site):
    with ToolServerProcess(["letter_count"], env={"PYTHONPATH": _env(site)["PYTHONPATH"]}) as s:
        status, out = post_json(
            s.url + "/get_observation",
            {
                "trajectory_ids": ["a", "b"],
                "actions": ["<count>r in strawberry</count>", "<count>strawberry</count>"],
            },
        )
    assert status == 200
    assert out["observations"][0]["obs"] == "3" and out["valids"] == [True, False]
    assert out["observations"][1]["invalid_reason"] == "bad_count_query"


def test_the_package_task_and_reward(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    try:
        from vtj_letter_count.reward import letter_count_reward
        from vtj_letter_count.task import LetterCountTask, generate

        train, evals, sft = generate(
            LetterCountTask(num_train=40, num_eval=10, num_demos=5), "[{obs}]"
        )
        pairs = lambda rows: {(r["extra_info"]["letter"], r["extra_info"]["word"]) for r in rows}
        assert len(pairs(train)) == 40 and len(pairs(evals)) == 10
        assert not pairs(train) & pairs(evals)
        for r in train + evals:
            letter, word = r["extra_info"]["letter"], r["extra_info"]["word"]
            assert r["reward_model"]["ground_truth"] == str(word.count(letter))
            assert r["data_source"] == "letter_count"
        assert {r["reward_model"]["ground_truth"] for r in train} > {"0", "1"}
        seg = sft[0]["response_segments"]
        n = sft[0]["reward_model"]["ground_truth"]
        assert [s["loss"] for s in seg] == [True, False, True] and seg[1]["text"] == f"[{n}]"
        assert letter_count_reward(f"x <answer> {n} </answer>", n, {}).score == 1.0
        assert letter_count_reward("<answer>three</answer>", "3", {}).score == 0.0
        assert letter_count_reward("3", "3", {}).info == {"has_answer": False}
        with pytest.raises(ValueError, match="num_demos"):
            generate(LetterCountTask(num_train=4, num_demos=5), "{obs}")
    finally:
        monkeypatch.undo()
        forget_modules(("vtj_letter_count",))


@pytest.mark.slow
def test_a_tiny_training_run_on_the_package(site, tmp_path):
    """The package's own config (its tool, task and reward) for 2 SFT + 2 GRPO steps."""
    out = tmp_path / "run"
    console = _run(
        site, "-m", "verltool_jax.train",
        "--config", f"{site}/vtj_letter_count/config.py:tiny",
        f"--config.trainer.out_dir={out}", "--config.logging.progress_bar=false",
        cwd=tmp_path, timeout=900,
    )  # fmt: skip
    source = "(package vtj-letter-count 0.1.0)"
    assert (
        f"[trainer] plugins: task letter_count {source}, tool letter_count {source}, "
        f"reward letter_count {source}"
    ) in console
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and not summary["interrupted"]
    assert "tool server with letter_count" in (out / "run.log").read_text()
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "data" / "train.parquet").to_pylist()
    assert len(rows) == 16 and {r["data_source"] for r in rows} == {"letter_count"}
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "policy/version" in r] == [1, 2]
    # every trajectory was scored by the package's reward
    assert "reward_name&quot;: &quot;letter_count&quot;" in (out / "trajectories.html").read_text()
