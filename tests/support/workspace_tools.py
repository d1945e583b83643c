"""Helpers shared by the image / file_editor / bash tool tests (not a test module)."""

from __future__ import annotations

import json
import os
import subprocess

from tool_server.launcher import get_json, post_json


def call(url: str, tid: str, action: str, extra: dict | None = None) -> tuple[dict, bool]:
    """One action through the real server -> (observation as a dict, valid)."""
    status, body = post_json(
        url + "/get_observation",
        {"trajectory_ids": [tid], "actions": [action], "extra_fields": [extra or {}]},
    )
    assert status == 200, body
    obs = body["observations"][0]
    if isinstance(obs, str):
        obs = {"obs": obs}
    return obs, body["valids"][0]


def finish(url: str, tid: str) -> None:
    status, body = post_json(
        url + "/get_observation", {"trajectory_ids": [tid], "actions": [""], "finish": [True]}
    )
    assert status == 200 and body["dones"] == [True], body


def tool_call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def live(url: str) -> int:
    return get_json(url + "/health")["live_trajectories"]


def workspaces(workdir: str) -> list[str]:
    d = os.path.join(workdir, "workspaces")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def disk_freed(workdir: str, timeout: float = 10.0) -> bool:
    """True once no workspace is left under ``workdir``, the background deletions of
    released ones (``<workdir>/trash``) included."""
    import time

    deadline = time.monotonic() + timeout
    trash = os.path.join(workdir, "trash")
    while time.monotonic() < deadline:
        if not workspaces(workdir) and not (os.path.isdir(trash) and os.listdir(trash)):
            return True
        time.sleep(0.05)
    return False


CALC = "def add(a, b):\n    return a + b\n"
TESTS = (
    "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
    "def test_add_zero():\n    assert add(0, 5) == 5\n"
)


def make_repo(path: str) -> str:
    """A small git repository: calc.py, test_calc.py, pkg/mod.py, symlinks in and out."""
    os.makedirs(os.path.join(path, "pkg"))
    with open(os.path.join(path, "calc.py"), "w") as f:
        f.write(CALC)
    with open(os.path.join(path, "test_calc.py"), "w") as f:
        f.write(TESTS)
    with open(os.path.join(path, "pkg", "mod.py"), "w") as f:
        f.write("".join(f"line {i}\n" for i in range(1, 21)))
    with open(os.path.join(path, "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho run\n")
    os.chmod(os.path.join(path, "run.sh"), 0o755)
    os.symlink("calc.py", os.path.join(path, "alias.py"))
    os.symlink("/etc", os.path.join(path, "etc_link"))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", path]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)
    return path


def snapshot(path: str) -> dict:
    """{relative path: (mode, bytes or link target)} of every file under ``path``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if os.path.islink(p):
                out[os.path.relpath(p, path)] = (st.st_mode, os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, path)] = (st.st_mode, st.st_uid, f.read())
            else:
                out[os.path.relpath(p, path)] = (st.st_mode, st.st_uid)
    return out
