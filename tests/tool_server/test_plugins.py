"""Tools from installed packages (entry-point group ``verltool_jax.tools``): discovery,
clashes, a plugin that fails to import, ``--list-tools`` and a real server that serves a
plugin tool and refuses only the broken one. The packages are written by hand
(``support.plugins``), exactly as pip leaves them: a dist-info folder on the path."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.plugins import BROKEN_MODULE, GOOD_TOOL, TOOL_GROUP, forget_modules, write_dist

from tool_server.kit.plugins import PluginError, discover
from tool_server.launcher import ToolServerProcess, get_json, post_json, refuse_unavailable_tools
from tool_server.registry import (
    BUILTIN_TOOL_DIR,
    _check_tool,
    _module_for,
    builtin_tool_names,
    discover_tools,
    tool_plugins,
    tools_in_module,
)

REPO = Path(__file__).resolve().parents[2]
MODULES = ("goodtools", "brokentools")


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Five packages: a good tool, a tool whose import fails, two packages declaring the
    same name, one reusing the built-in name ``sql``, and one whose entry point's name is
    not its tool's name."""
    root = tmp_path / "site"
    write_dist(
        root, "good-tools", {TOOL_GROUP: {"shout": "goodtools.shout:ShoutTool"}},
        {"goodtools/shout.py": GOOD_TOOL},
    )  # fmt: skip
    write_dist(
        root, "broken-tools", {TOOL_GROUP: {"broken": "brokentools.mod:Tool"}},
        {"brokentools/mod.py": BROKEN_MODULE},
    )  # fmt: skip
    write_dist(root, "clash-a", {TOOL_GROUP: {"twice": "goodtools.shout:ShoutTool"}}, {})
    write_dist(root, "clash-b", {TOOL_GROUP: {"twice": "goodtools.shout:ShoutTool"}}, {})
    write_dist(root, "builtin-clash", {TOOL_GROUP: {"sql": "goodtools.shout:ShoutTool"}}, {})
    write_dist(root, "misnamed", {TOOL_GROUP: {"yell": "goodtools.shout:ShoutTool"}}, {})
    monkeypatch.syspath_prepend(str(root))
    tool_plugins(refresh=True)
    yield root
    monkeypatch.undo()
    forget_modules(MODULES)
    tool_plugins(refresh=True)


def test_discover_records_each_problem_against_its_name_only(installed):
    group = discover(TOOL_GROUP, "tool", ["sql"], _check_tool)
    assert sorted(group.plugins) == ["broken", "shout", "yell"]
    assert group.load("shout").name == "shout"
    assert group.source("shout") == "package good-tools 1.0"
    twice = group.problems["twice"]
    assert "clash-a" in twice and "clash-b" in twice and "more than one package" in twice
    assert "built in" in group.problems["sql"] and "builtin-clash" in group.problems["sql"]
    with pytest.raises(PluginError, match=r"broken-tools.*libfoo") as e:
        group.load("broken")
    assert "broken = 'brokentools.mod:Tool'" in str(e.value)
    assert "pip uninstall broken-tools" in str(e.value)
    # recorded: the second use fails the same way without importing again
    forget_modules(MODULES)
    with pytest.raises(PluginError, match="libfoo"):
        group.load("broken")
    assert "brokentools.mod" not in sys.modules
    with pytest.raises(PluginError, match=r"misnamed.*name must be the tool's name"):
        group.load("yell")
    with pytest.raises(KeyError):
        group.load("nobody_has_this")


def test_requested_plugin_tools_load_and_problems_name_the_package(installed, caplog):
    assert discover_tools(["shout"])["shout"].__module__ == "goodtools.shout"
    assert list(discover_tools(["finish", "shout"])) == ["finish", "shout"]
    with pytest.raises(PluginError, match="broken-tools"):
        discover_tools(["finish", "broken"])
    with pytest.raises(PluginError, match="builtin-clash"):
        discover_tools(["sql"])
    with pytest.raises(PluginError, match=r"clash-a.*clash-b"):
        discover_tools(["twice"])
    with pytest.raises(KeyError, match=r"unknown tool\(s\) \['nope'\].*'shout'"):
        discover_tools(["nope"])
    # every tool: the broken plugins are logged with their package and left out
    with caplog.at_level(logging.WARNING, logger="tool_server.plugins"):
        every = discover_tools()
    assert {"shout", "python_code", "finish"} <= set(every)
    assert every["sql"].__module__ == "tool_server.tools.sql"
    assert not {"broken", "twice", "yell"} & set(every)
    assert "broken-tools" in caplog.text and "misnamed" in caplog.text


def test_builtin_tool_files_are_named_after_their_tools():
    """builtin_tool_names reads the file names only; it is right only if this holds."""
    for stem in builtin_tool_names():
        assert set(tools_in_module(_module_for(BUILTIN_TOOL_DIR / f"{stem}.py"))) == {stem}


def _env(root: Path) -> dict:
    return {"PYTHONPATH": f"{root}{os.pathsep}{REPO}"}


def test_list_tools_shows_sources_and_unusable_plugins(installed):
    out = subprocess.run(
        [sys.executable, "-m", "tool_server", "--list-tools"],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, **_env(installed)},
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines()[1:]:
        name, rest = line.split(None, 1)
        rows.setdefault(name, []).append(rest)
    assert rows["shout"] == [rows["shout"][0]] and "package good-tools 1.0" in rows["shout"][0]
    assert "<shout>text</shout>" in rows["shout"][0]
    assert "UNUSABLE" in rows["broken"][0] and "libfoo" in rows["broken"][0]
    sql = rows["sql"]  # the built-in works; the clashing plugin is listed as unusable
    assert sql[0].startswith("built-in") and "UNUSABLE" in sql[1] and "builtin-clash" in sql[1]
    assert rows["python_code"][0].startswith("built-in")


def test_server_serves_a_plugin_tool_and_fails_closed_for_a_broken_one_only(installed):
    with ToolServerProcess(["shout", "broken", "sql"], env=_env(installed)) as server:
        status, out = post_json(
            server.url + "/get_observation",
            {"trajectory_ids": ["t", "u"], "actions": ["<shout>hello</shout>", "<broken/>"]},
        )
        assert status == 200 and out["observations"][0] == "HELLO"
        assert out["valids"] == [True, False]  # nobody claims the broken tool's action
        health = get_json(server.url + "/health")
    assert health["tools"] == ["shout"]
    assert set(health["unavailable_tools"]) == {"broken", "sql"}
    assert "broken-tools" in health["unavailable_tools"]["broken"]
    assert "libfoo" in health["unavailable_tools"]["broken"]
    assert "builtin-clash" in health["unavailable_tools"]["sql"]
    # a run needs every tool it names: the trainer refuses such a server
    with pytest.raises(ValueError, match=r"cannot serve \['broken', 'sql'\].*broken-tools"):
        refuse_unavailable_tools(health)
    refuse_unavailable_tools({"tools": ["shout"], "unavailable_tools": {}})
    # with nothing left to serve, the server does not start, and says why
    with pytest.raises(RuntimeError, match=r"(?s)no tool can be served.*broken-tools.*libfoo"):
        ToolServerProcess(["broken"], env=_env(installed)).start()
