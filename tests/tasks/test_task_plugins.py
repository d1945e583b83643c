"""Tasks and rewards from installed packages (entry-point groups ``verltool_jax.tasks``
and ``verltool_jax.rewards``): a plugin task is configured, validated and written like a
built-in, a plugin reward scores by data_source (also in a reward worker process), and a
broken or clashing plugin is an error naming its package for that name only. The
packages are written by hand (``support.plugins``): a dist-info folder on the path."""

from __future__ import annotations

import json

import pytest
from support.plugins import (
    BROKEN_MODULE,
    REWARD_GROUP,
    TASK_GROUP,
    forget_modules,
    write_dist,
)

from tool_server.kit.plugins import PluginError
from verltool_jax import plugins as listing
from verltool_jax.rewards import get_reward_fn, resolve_reward_name
from verltool_jax.rewards.base import reward_plugins
from verltool_jax.rewards.compute import RewardPool
from verltool_jax.run_config import ConfigError, default_config_dict, run_config_from_dict
from verltool_jax.tasks import known_tasks, prepare_task, task_plugins, task_section

COUNTING = """
    import json
    from dataclasses import dataclass
    from pathlib import Path

    from verltool_jax.rewards import RewardResult
    from verltool_jax.tasks import TaskFiles


    @dataclass(frozen=True)
    class CountingTask:
        name: str = "counting"
        upto: int = 3


    def _row(i, split):
        return {"prompt": [{"role": "user", "content": f"Count to {i}."}],
                "data_source": "counting", "reward_model": {"ground_truth": str(i)},
                "extra_info": {"split": split}}


    def write_task_from_config(config, out_dir):
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {}
        for split in ("train", "eval"):
            paths[split] = out / f"{split}.jsonl"
            rows = [_row(i, split) for i in range(1, config.task.upto + 1)]
            paths[split].write_text("".join(json.dumps(r) + "\\n" for r in rows))
        return TaskFiles(train=paths["train"], eval=paths["eval"])


    TASK_CONFIG = CountingTask


    def counting_reward(response_text, ground_truth, extra_info):
        ok = response_text.split()[-1:] == [str(ground_truth)]
        return RewardResult(float(ok), ok)
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A package with the task and reward ``counting``; one whose task and reward fail
    to import; one reusing the built-in task ``tiny_math`` and the built-in reward
    ``math``; and one whose task entry point is not a task."""
    root = tmp_path / "site"
    write_dist(
        root, "counting-pkg",
        {TASK_GROUP: {"counting": "countpkg.counting"},
         REWARD_GROUP: {"counting": "countpkg.counting:counting_reward"}},
        {"countpkg/counting.py": COUNTING},
    )  # fmt: skip
    write_dist(
        root, "broken-pkg",
        {TASK_GROUP: {"broken_task": "brokenpkg.mod"},
         REWARD_GROUP: {"broken_reward": "brokenpkg.mod:fn"}},
        {"brokenpkg/mod.py": BROKEN_MODULE},
    )  # fmt: skip
    write_dist(
        root, "clash-pkg",
        {TASK_GROUP: {"tiny_math": "countpkg.counting"},
         REWARD_GROUP: {"math": "countpkg.counting:counting_reward"}},
        {},
    )  # fmt: skip
    write_dist(root, "not-a-task", {TASK_GROUP: {"odd": "countpkg.counting:CountingTask"}}, {})
    monkeypatch.syspath_prepend(str(root))
    task_plugins(refresh=True)
    reward_plugins(refresh=True)
    yield root
    monkeypatch.undo()
    forget_modules(("countpkg", "brokenpkg"))
    task_plugins(refresh=True)
    reward_plugins(refresh=True)


def _config(task: str):
    c = default_config_dict()
    c.task = task_section(task)
    return c


def test_a_plugin_task_is_configured_validated_and_written(installed, tmp_path):
    assert "counting" in known_tasks() and "tiny_math" in known_tasks()
    c = _config("counting")
    assert c.task.to_dict() == {"name": "counting", "upto": 3}
    c.task.upto = 2
    rc = run_config_from_dict(c)
    files = prepare_task(rc, tmp_path / "data")
    rows = [json.loads(x) for x in files.train.read_text().splitlines()]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["1", "2"]
    c.task = {"name": "counting", "up_to": 2}  # checked against the plugin's dataclass
    with pytest.raises(ConfigError, match="task.up_to"):
        run_config_from_dict(c)


def test_broken_and_clashing_task_plugins_name_the_package(installed):
    with pytest.raises(PluginError, match=r"broken-pkg.*libfoo"):
        task_section("broken_task")
    c = default_config_dict()
    c.task = {"name": "broken_task"}
    with pytest.raises(ConfigError, match="broken-pkg"):  # reported as a config problem
        run_config_from_dict(c)
    with pytest.raises(PluginError, match=r"both built in.*clash-pkg"):
        task_section("tiny_math")
    with pytest.raises(PluginError, match=r"not-a-task.*lacks TASK_CONFIG"):
        task_section("odd")
    # the other tasks are untouched
    assert task_section("vt_math").name == "vt_math"


def test_a_plugin_reward_scores_its_data_source_here_and_in_a_worker(installed):
    assert resolve_reward_name("counting") == "counting"
    assert resolve_reward_name("counting_v2") == "counting"  # prefix routing, as built-ins
    assert get_reward_fn("counting")("one two 3", "3", {}).score == 1.0
    assert resolve_reward_name("searchR1_nq") == "qa_em"  # built-ins unaffected
    with pytest.raises(PluginError, match=r"broken-pkg.*libfoo"):
        get_reward_fn("broken_reward")
    with pytest.raises(PluginError, match=r"both built in.*clash-pkg"):
        resolve_reward_name("math")
    with pytest.raises(ValueError, match=r"cannot be used: \['broken_reward', 'math'\]"):
        resolve_reward_name("unknown_source")
    row = {"data_source": "counting", "reward_model": {"ground_truth": "2"}}
    with RewardPool(num_workers=1, timeout_s=30.0, warm_up=False) as pool:
        results = pool.score([("1 2", row), ("1 3", row)])
    assert [r.score for r in results] == [1.0, 0.0]
    assert results[0].info["reward_name"] == "counting" and "error" not in results[1].info


def test_a_run_names_the_plugins_it_uses(installed):
    rc = run_config_from_dict(_config("counting"))
    assert listing.plugins_of_run(rc) == [
        "task counting (package counting-pkg 1.0)",
        "reward counting (package counting-pkg 1.0)",  # broken_reward is left out
    ]
    assert listing.plugins_of_run(run_config_from_dict(_config("vt_math"))) == [
        "reward counting (package counting-pkg 1.0)"  # may serve a row: reward.name is empty
    ]
    c = _config("vt_math")
    c.reward.name = "qa_em"  # a built-in reward: no plugin involved
    assert listing.plugins_of_run(run_config_from_dict(c)) == []


def test_plugins_listing_shows_sources_and_problems(installed, capsys):
    assert listing.main(["--list-tasks", "--list-rewards"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()

    def rows(name):
        return [x for x in lines if x.split()[:1] == [name]]

    assert "package counting-pkg 1.0" in rows("counting")[0]  # the task
    assert "data_source: counting" in rows("counting")[1]  # the reward
    assert any("UNUSABLE" in x and "libfoo" in x for x in rows("broken_task"))
    tiny = rows("tiny_math")
    assert "built-in" in tiny[0] and "UNUSABLE" in tiny[1] and "clash-pkg" in tiny[1]
    assert "built-in" in rows("qa_em")[0]
