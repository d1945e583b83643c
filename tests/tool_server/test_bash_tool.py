"""bash (persistent sandboxed shell) and run_tests, end to end through the real server,
sharing one workspace with file_editor; isolation, timeouts, truncation, cleanup."""

import os
import subprocess
import time
import uuid

import pytest
from support.workspace_tools import (
    call,
    disk_freed,
    finish,
    live,
    make_repo,
    snapshot,
    tool_call,
    workspaces,
)

from tool_server.launcher import post_json, run_server
from tool_server.tools.bash import parse_bash_action
from tool_server.tools.run_tests import parse_test_counts, reward_from_counts

MAX_OBS = 2000


def sh(cmd: str) -> str:
    return f"<bash>{cmd}</bash>"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    repo = make_repo(str(tmp_path_factory.mktemp("src") / "repo"))
    workdir = str(tmp_path_factory.mktemp("wd"))
    with run_server(
        tools=["bash", "file_editor", "run_tests"],
        timeout=30,
        max_obs_length=MAX_OBS,
        workdir=workdir,
        tool_opt={"bash_timeout_s": 2},
    ) as url:
        yield url, repo, workdir


def test_parsing_and_counts():
    assert parse_bash_action("x <bash>ls</bash> y <bash>pwd</bash>") == "pwd"
    assert parse_bash_action("run:\n```bash\nls -la\n```\n") == "ls -la"
    assert parse_bash_action("```python\nprint(1)\n```") is None
    assert parse_test_counts("..F\n=== 1 failed, 2 passed, 1 error in 0.1s ===") == {
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 0,
        "xfailed": 0,
        "xpassed": 0,
    }
    assert reward_from_counts(parse_test_counts("3 passed in 1s"), 0) == 1.0
    assert reward_from_counts(parse_test_counts("3 passed, 1 failed"), 1) == 0.0
    assert reward_from_counts(parse_test_counts("no tests ran"), 5) == 0.0


def test_persistent_shell(env):
    url, repo, _ = env
    extra = {"repo_path": repo}
    obs, valid = call(url, "b-state", sh("pwd; ls"), extra)
    assert valid and obs["obs"].splitlines()[0] == "/workspace"
    assert "calc.py" in obs["obs"] and obs["metrics"]["exit_code"] == 0
    call(url, "b-state", sh("cd pkg && export GREETING=hello && f() { echo fn$1; }"), extra)
    obs, _ = call(url, "b-state", "```bash\npwd; echo $GREETING; f 7\n```", extra)
    assert obs["obs"] == "/workspace/pkg\nhello\nfn7"
    obs, valid = call(
        url,
        "b-state",
        sh("echo out; echo err >&2; exit_code_test() { return 3; }; exit_code_test"),
        extra,
    )
    assert valid and obs["obs"] == "out\nerr\n[exit code 3]" and obs["metrics"]["exit_code"] == 3
    # a syntax error or a command reading stdin cannot wedge the shell
    obs, _ = call(url, "b-state", sh("if then"), extra)
    assert "syntax error" in obs["obs"] and obs["metrics"]["exit_code"] == 2
    obs, _ = call(url, "b-state", sh("cat; echo after-cat"), extra)
    assert obs["obs"] == "after-cat"
    # exiting the shell is reported, and the next command gets a fresh one
    obs, _ = call(url, "b-state", sh("exit 4"), extra)
    assert "the shell exited (status 4)" in obs["obs"]
    obs, _ = call(url, "b-state", sh("pwd; echo ${GREETING:-unset}"), extra)
    assert obs["obs"] == "/workspace\nunset"
    obs, valid = call(url, "b-state", sh("   "), extra)
    assert not valid and "Empty bash command" in obs["obs"]
    finish(url, "b-state")


def test_isolation_and_original_repo_untouched(env):
    url, repo, _ = env
    before = snapshot(repo)
    extra = {"repo_path": repo}
    marker = f"h3-escape-{uuid.uuid4().hex[:8]}"
    cmds = [
        # in-place writes, appends, sed -i, chmod, truncation, git commit in the workspace
        "echo hacked >> calc.py; printf 'x' > test_calc.py; sed -i 's/line/LINE/' pkg/mod.py",
        "chmod 700 run.sh; : > alias.py; rm -rf etc_link",
        "git -c user.email=a@b -c user.name=a commit -qam change && git log --oneline | wc -l",
        # nothing outside the workspace is writable or even visible
        f"touch /usr/{marker}; touch /etc/{marker}; touch {repo}/{marker}; ls {repo}",
        f"echo x > /tmp/{marker} && cat /tmp/{marker}",
    ]
    outs = [call(url, "b-iso", sh(c), extra)[0]["obs"] for c in cmds]
    assert outs[2].startswith("2")  # the commit happened in the workspace's own .git
    assert "Read-only file system" in outs[3] or "Permission denied" in outs[3]
    assert "No such file or directory" in outs[3]  # the host repo path does not exist inside
    assert outs[4] == "x"  # /tmp is a private tmpfs
    assert not os.path.exists(f"/tmp/{marker}") and not os.path.exists(f"/usr/{marker}")
    # git objects: hardlinked to the original when the sandbox runs as another uid (root
    # server), and then neither writable nor chmod-able from the sandbox
    obs, _ = call(
        url,
        "b-iso",
        sh(
            "f=$(find .git/objects -type f -links +1 | head -1); echo links=${f:+yes}; "
            '[ -n "$f" ] && { chmod u+w $f 2>&1; echo x >> $f 2>&1; cat /dev/null > $f 2>&1; }'
        ),
        extra,
    )
    if os.geteuid() == 0:
        assert obs["obs"].startswith("links=yes"), obs
        assert (
            obs["obs"].count("Operation not permitted") + obs["obs"].count("Permission denied") == 3
        ), obs
    obs, _ = call(
        url, "b-iso", sh("git status --short | wc -l && git log --oneline | wc -l"), extra
    )
    assert obs["metrics"]["exit_code"] == 0 and obs["obs"].split()[1] == "2"
    # no network at all
    obs, _ = call(
        url,
        "b-iso",
        sh(
            "python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\" "
            "2>&1 | tail -1"
        ),
        extra,
    )
    assert "Network is unreachable" in obs["obs"] or "Errno" in obs["obs"]
    obs, _ = call(url, "b-iso", sh("awk -F: 'NR > 2 {print $1}' /proc/net/dev"), extra)
    assert obs["obs"].split() == ["lo"]  # an empty network namespace
    finish(url, "b-iso")
    assert snapshot(repo) == before


def test_timeout_kills_and_restarts(env):
    url, repo, _ = env
    extra = {"repo_path": repo}
    tag = f"{uuid.uuid4().int % 1000 + 7000}"
    call(url, "b-slow", sh(f"cd pkg; sleep {tag}.5 &"), extra)
    t = time.monotonic()
    obs, valid = call(url, "b-slow", sh("echo started; sleep 60"), extra)
    elapsed = time.monotonic() - t
    assert valid and 1.5 < elapsed < 10, elapsed
    assert obs["obs"].startswith("started\n[command timed out after 2s; the shell was killed")
    assert obs["metrics"]["timed_out"] is True
    # the background job died with the old shell; the new shell starts afresh
    obs, _ = call(url, "b-slow", sh("pwd; ps -e -o comm= | sort | uniq | tr '\\n' ' '"), extra)
    assert obs["obs"].startswith("/workspace\n") and "sleep" not in obs["obs"]
    assert subprocess.run(["pgrep", "-f", f"sleep {tag}.5"], capture_output=True).returncode == 1
    finish(url, "b-slow")


def test_output_truncated(env):
    url, repo, _ = env
    obs, _ = call(url, "b-big", sh("seq 1 200000"), {"repo_path": repo})
    text = obs["obs"]
    assert len(text) <= MAX_OBS and "truncated" in text
    assert text.startswith("1\n2\n3\n") and text.endswith("199999\n200000")
    finish(url, "b-big")


def test_shared_workspace_and_run_tests(env):
    url, repo, workdir = env
    extra = {"repo_path": repo, "test_cmd": "python -m pytest -q -p no:cacheprovider test_calc.py"}
    tid = "b-swe"
    obs, valid = call(url, tid, tool_call("run_tests"), extra)
    assert valid and obs["metrics"]["passed"] == 2 and obs["metrics"]["failed"] == 0
    assert (
        obs["reward"] == 1.0 and "[tests: 2 passed, 0 failed, 0 errors; exit code 0]" in obs["obs"]
    )
    # file_editor breaks the code; bash sees the change; run_tests counts the failure
    obs, valid = call(
        url,
        tid,
        tool_call(
            "file_editor",
            command="str_replace",
            path="calc.py",
            old_str="a + b",
            new_str="a + b + (a == 0)",
        ),
        extra,
    )
    assert valid
    obs, _ = call(url, tid, sh("grep -c 'a == 0' calc.py"), extra)
    assert obs["obs"] == "1"
    obs, valid = call(url, tid, tool_call("run_tests"), extra)
    assert valid and obs["metrics"]["failed"] == 1 and obs["metrics"]["passed"] == 1
    assert obs["reward"] == 0.0 and obs["metrics"]["exit_code"] == 1
    # bash writes a file, file_editor reads it (files made on either side work on both)
    call(url, tid, sh("printf 'hello from bash\\n' > notes.txt"), extra)
    obs, valid = call(url, tid, tool_call("file_editor", command="view", path="notes.txt"), extra)
    assert valid and "     1\thello from bash" in obs["obs"]
    call(
        url,
        tid,
        tool_call("file_editor", command="create", path="made_by_editor.txt", file_text="v1\n"),
        extra,
    )
    obs, _ = call(url, tid, sh("echo v2 >> made_by_editor.txt && cat made_by_editor.txt"), extra)
    assert obs["obs"] == "v1\nv2"
    assert len(workspaces(workdir)) == 1  # one workspace for the three tools
    obs, valid = call(url, tid, tool_call("run_tests", verbose=True), extra)
    assert not valid and "run_tests takes no arguments" in obs["obs"]
    obs, valid = call(url, tid, tool_call("run_tests"), dict(extra, test_cmd=""))
    assert not valid and 'extra_field["test_cmd"] must be a non-empty' in obs["obs"]
    finish(url, tid)
    assert tid not in " ".join(workspaces(workdir))


def test_concurrent_trajectories_get_their_own_workspace(env):
    url, repo, workdir = env
    tids = [f"b-par{i}" for i in range(4)]
    status, body = post_json(
        url + "/get_observation",
        {
            "trajectory_ids": tids,
            "actions": [sh(f"echo {t} > mine.txt; ls | wc -l") for t in tids],
            "extra_fields": [{"repo_path": repo}] * 4,
        },
    )
    assert status == 200 and all(body["valids"])
    counts = {o["obs"] for o in body["observations"]}
    assert len(counts) == 1  # each saw only its own new file next to the repository's
    for t in tids:
        obs, _ = call(url, t, sh("cat mine.txt"), {"repo_path": repo})
        assert obs["obs"] == t
    assert len(workspaces(workdir)) == 4
    for t in tids:
        finish(url, t)


def test_run_tests_timeout(env):
    url, repo, _ = env
    obs, valid = call(
        url,
        "b-rt",
        tool_call("run_tests"),
        {"repo_path": repo, "test_cmd": "echo begin; sleep 30", "test_timeout_s": 1},
    )
    assert valid and obs["metrics"]["timed_out"] is True and obs["reward"] == 0.0
    assert obs["obs"].startswith("begin\n[command timed out after 1s")
    finish(url, "b-rt")


def test_bad_repo_path(env, tmp_path):
    url, _, _ = env
    obs, valid = call(url, "b-bad", sh("ls"), {"repo_path": str(tmp_path / "missing")})
    assert not valid and 'extra_field["repo_path"] must be an existing directory' in obs["obs"]
    finish(url, "b-bad")


def test_cleanup_on_finish_and_ttl(tmp_path):
    repo = make_repo(str(tmp_path / "repo"))
    workdir = str(tmp_path / "wd")
    tag = f"{uuid.uuid4().int % 1000 + 8000}"
    with run_server(
        tools=["bash", "file_editor"],
        timeout=10,
        workdir=workdir,
        state_ttl=4.0,  # long enough that a loaded machine finishes three calls first
        sweep_interval=0.2,
    ) as url:
        extra = {"repo_path": repo}
        call(url, "c-fin", sh(f"sleep {tag}.25 &"), extra)
        call(url, "c-ttl", sh(f"sleep {tag}.75 &"), extra)
        call(url, "c-ttl", tool_call("file_editor", command="view", path="calc.py"), extra)
        assert len(workspaces(workdir)) == 2
        assert subprocess.run(["pgrep", "-f", f"sleep {tag}.25"]).returncode == 0
        finish(url, "c-fin")
        assert len(workspaces(workdir)) == 1
        assert gone(f"sleep {tag}.25")
        deadline = time.monotonic() + 20
        while (workspaces(workdir) or live(url)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert workspaces(workdir) == [] and live(url) == 0 and disk_freed(workdir)
        assert gone(f"sleep {tag}.75")


def gone(pattern: str, within_s: float = 5.0) -> bool:
    """Whether no process matches ``pattern`` within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while subprocess.run(["pgrep", "-f", pattern]).returncode == 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_fails_closed_without_sandbox(tmp_path):
    repo = make_repo(str(tmp_path / "repo"))
    marker = tmp_path / "ran"
    with run_server(
        tools=["bash", "run_tests"],
        timeout=10,
        workdir=str(tmp_path / "wd"),
        env={"VERLTOOL_BWRAP": str(tmp_path / "no-bwrap")},
    ) as url:
        obs, valid = call(url, "nb", sh(f"touch {marker}"), {"repo_path": repo})
        assert not valid and "sandbox unavailable, refusing to run code" in obs["obs"]
        obs, valid = call(
            url, "nb", tool_call("run_tests"), {"repo_path": repo, "test_cmd": f"touch {marker}"}
        )
        assert not valid and "refusing to run code" in obs["obs"]
        assert not marker.exists()
        finish(url, "nb")
