"""file_editor end to end through the real server: commands, path safety, cleanup."""

import os

import pytest
from support.workspace_tools import (
    CALC,
    call,
    disk_freed,
    finish,
    live,
    make_repo,
    snapshot,
    tool_call,
    workspaces,
)

from tool_server.kit.workspace import Workspace
from tool_server.launcher import run_server
from tool_server.tools.file_editor import (
    EditorError,
    insert_after,
    line_count,
    read_text,
    replace_unique,
    write_text,
)


def fe(**args) -> str:
    return tool_call("file_editor", **args)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    repo = make_repo(str(tmp_path_factory.mktemp("src") / "repo"))
    workdir = str(tmp_path_factory.mktemp("wd"))
    with run_server(
        tools=["image", "run_tests", "file_editor"], timeout=10, workdir=workdir
    ) as url:
        yield url, repo, workdir


def test_text_operations():
    assert line_count("") == 0 and line_count("a") == 1 and line_count("a\nb\n") == 2
    assert insert_after("a\nb\n", 1, "X") == "a\nX\nb\n"
    assert insert_after("a\nb", 2, "X\n") == "a\nb\nX"
    assert replace_unique("x\ny\n", "y", "z", "f") == ("x\nz\n", 2)
    with pytest.raises(EditorError, match=r"occurs 2 times in f \(lines \[1, 2\]\)"):
        replace_unique("y\ny\n", "y", "z", "f")


def test_write_never_goes_through_a_hardlink(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    root = tmp_path / "ws"
    root.mkdir()
    os.link(outside, root / "linked.txt")
    (root / "plain.txt").write_text("a\n")
    ws = Workspace("t", str(root), None, None)
    write_text(ws, "linked.txt", "changed\n")
    write_text(ws, "plain.txt", "b\n")  # single link: rewritten in place (same inode)
    assert outside.read_text() == "original\n"
    assert read_text(ws, "linked.txt") == "changed\n" and os.stat(root / "linked.txt").st_nlink == 1
    assert read_text(ws, "plain.txt") == "b\n"


def test_view(env):
    url, repo, _ = env
    extra = {"repo_path": repo}
    obs, valid = call(url, "fe-view", fe(command="view", path="calc.py"), extra)
    assert valid and "     1\tdef add(a, b):\n     2\t    return a + b" in obs["obs"]
    obs, valid = call(
        url, "fe-view", fe(command="view", path="pkg/mod.py", view_range=[3, 5]), extra
    )
    assert valid and obs["obs"].endswith("     3\tline 3\n     4\tline 4\n     5\tline 5")
    obs, valid = call(
        url, "fe-view", fe(command="view", path="pkg/mod.py", view_range=[19, -1]), extra
    )
    assert valid and obs["obs"].endswith("    19\tline 19\n    20\tline 20")
    obs, valid = call(url, "fe-view", fe(command="view", path="."), extra)
    assert valid and "calc.py" in obs["obs"] and "pkg/mod.py" in obs["obs"]
    assert ".git" not in obs["obs"]
    # absolute paths under the sandbox mount point name the same files
    obs, valid = call(url, "fe-view", fe(command="view", path="/workspace/calc.py"), extra)
    assert valid and "return a + b" in obs["obs"]
    # a symlink that stays inside the workspace is fine
    obs, valid = call(url, "fe-view", fe(command="view", path="alias.py"), extra)
    assert valid and "return a + b" in obs["obs"]
    finish(url, "fe-view")


def test_edits_change_the_workspace_not_the_repo(env):
    url, repo, workdir = env
    before = snapshot(repo)
    extra = {"repo_path": repo}
    obs, valid = call(
        url,
        "fe-edit",
        fe(command="str_replace", path="calc.py", old_str="a + b", new_str="a - b"),
        extra,
    )
    assert valid and "has been edited" in obs["obs"] and "     2\t    return a - b" in obs["obs"]
    obs, valid = call(
        url,
        "fe-edit",
        fe(command="insert", path="calc.py", insert_line=0, new_str="import math"),
        extra,
    )
    assert valid and "     1\timport math" in obs["obs"]
    obs, valid = call(
        url, "fe-edit", fe(command="create", path="new/dir/x.py", file_text="X = 1\n"), extra
    )
    assert valid and "created" in obs["obs"]
    obs, valid = call(
        url,
        "fe-edit",
        fe(command="str_replace", path="run.sh", old_str="echo run", new_str="echo ran"),
        extra,
    )
    assert valid
    [ws] = workspaces(workdir)
    root = os.path.join(workdir, "workspaces", ws, "repo")
    with open(os.path.join(root, "calc.py")) as f:
        assert f.read() == "import math\n" + CALC.replace("a + b", "a - b")
    with open(os.path.join(root, "new/dir/x.py")) as f:
        assert f.read() == "X = 1\n"
    assert os.stat(os.path.join(root, "run.sh")).st_mode & 0o111  # mode kept
    assert snapshot(repo) == before  # the original repository is untouched
    finish(url, "fe-edit")
    assert workspaces(workdir) == [] and live(url) == 0 and disk_freed(workdir)


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            dict(command="str_replace", path="calc.py", old_str="nope", new_str="x"),
            "did not appear verbatim",
        ),
        (
            dict(command="str_replace", path="pkg/mod.py", old_str="line 1", new_str="x"),
            "occurs 11 times",
        ),
        (dict(command="str_replace", path="calc.py", old_str="", new_str="x"), "must not be empty"),
        (dict(command="create", path="calc.py", file_text="x"), "already exists"),
        (dict(command="create", path="y.py"), '"file_text"'),
        (
            dict(command="insert", path="calc.py", insert_line=99, new_str="x"),
            '"insert_line" must be an integer between 0 and 2',
        ),
        (dict(command="view", path="calc.py", view_range=[0, 2]), '"view_range" start 0'),
        (dict(command="view", path="calc.py", view_range=[1, 9]), '"view_range" end 9'),
        (dict(command="view", path="missing.py"), "does not exist"),
        (dict(command="delete", path="calc.py"), '"command" must be one of'),
        (dict(command="view"), '"path" must be a non-empty string'),
        (dict(command="view", path="calc.py", mode="x"), "unknown argument(s) ['mode']"),
        # escapes: '..', absolute paths outside, symlinks pointing outside
        (dict(command="view", path="../../../../etc/passwd"), "escapes the workspace"),
        (dict(command="view", path="/etc/passwd"), "is outside the workspace"),
        (dict(command="view", path="/workspace/../etc/passwd"), "escapes the workspace"),
        (dict(command="view", path="etc_link/passwd"), "escapes the workspace"),
        (dict(command="create", path="etc_link/evil", file_text="x"), "escapes the workspace"),
        (dict(command="create", path="../evil.py", file_text="x"), "escapes the workspace"),
    ],
)
def test_errors_are_observations(env, args, expected):
    url, repo, _ = env
    obs, valid = call(url, "fe-err", fe(**args), {"repo_path": repo})
    assert not valid and expected in obs["obs"], obs
    assert not os.path.exists("/etc/evil") and not os.path.exists(
        os.path.dirname(repo) + "/evil.py"
    )


def test_bad_calls(env, tmp_path):
    url, repo, _ = env
    obs, valid = call(
        url, "fe-bad", tool_call("file_edit", command="view", path="."), {"repo_path": repo}
    )
    assert not valid and "did you mean 'file_editor'" in obs["obs"]
    obs, valid = call(
        url,
        "fe-bad",
        '<tool_call>{"name": "file_editor", "arguments": {"command": "view", path: 1}}</tool_call>',
        {},
    )
    assert not valid and "Invalid JSON" in obs["obs"]
    obs, valid = call(
        url, "fe-bad2", fe(command="view", path="."), {"repo_path": str(tmp_path / "nope")}
    )
    assert not valid and 'extra_field["repo_path"] must be an existing directory' in obs["obs"]
    # without a repo_path the workspace starts empty
    obs, valid = call(url, "fe-empty", fe(command="create", path="a.txt", file_text="hi\n"), {})
    assert valid
    obs, valid = call(url, "fe-empty", fe(command="view", path="a.txt"), {})
    assert valid and "     1\thi" in obs["obs"]
    for tid in ("fe-bad", "fe-bad2", "fe-empty", "fe-err"):
        finish(url, tid)
