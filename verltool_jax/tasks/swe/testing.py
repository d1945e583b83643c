"""The task record, and running a task's tests: pytest commands, restoring the pristine
test files, running on a scratch copy, validating a task."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

DATA_SOURCE = "swe"
SLOW_TEST_TIMEOUT_S = 5  # least per-test limit inside pytest (pytest-timeout)
CALIBRATION_TEST_TIMEOUT_S = 120  # per-test limit while timing the fixed program
RUN_TIMEOUT_S = 300.0  # a whole validation run
SWEBENCH_TEST_TIMEOUT_S = 60  # per-test limit of SWE-bench-style tasks
PYTEST_CONFIG_FILES = ("pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")

QUIXBUGS_CONFTEST = """import pytest


def pytest_configure(config):
    # the tests import python_programs.<name> unless use_correct; slow cases are skipped
    pytest.use_correct = False
    pytest.run_slow = False
"""


class TaskRejected(ValueError):
    """A task cannot be used; the message says why (e.g. its hidden tests already pass)."""


@dataclass
class SweTask:
    task_id: str
    repo_path: str
    statement: str
    test_cmd: str  # visible: what the agent's run_tests runs
    hidden_test_cmd: str  # decides the reward
    fail_to_pass: list = field(default_factory=list)
    pass_to_pass: list = field(default_factory=list)
    oracle_path: str | None = None  # folder with the fixed files (relative to the repo)
    source: str = ""  # quixbugs | quixbugs-mutant | swebench
    meta: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- tests


@dataclass
class TestRun:
    exit_code: int | None
    outcomes: dict  # node id -> PASSED | FAILED | ERROR | SKIPPED
    timed_out: bool
    seconds: float
    output: str

    def passed(self) -> set:
        return {k for k, v in self.outcomes.items() if v == "PASSED"}


_OUTCOME_RE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def parse_outcomes(output: str) -> dict:
    """Node id -> outcome from pytest's ``-rA`` short summary (``PASSED path::test``)."""
    out = {}
    for line in output.splitlines():
        m = _OUTCOME_RE.match(line.strip())
        if m and "::" in m.group(2):
            out[m.group(2)] = m.group(1)
    return out


def pytest_cmd(targets: Sequence[str], per_test_timeout_s: int = SLOW_TEST_TIMEOUT_S) -> str:
    """``python -m pytest -q -rA`` over ``targets`` (node ids or files), with a per-test
    timeout when pytest-timeout is installed (a buggy program may never return)."""
    parts = ["python", "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        parts.append(f"--timeout={per_test_timeout_s}")
    return " ".join(parts + [shlex.quote(t) for t in targets])


def restore_files_cmd(files: dict[str, bytes], remove: Sequence[str] = ()) -> str:
    """A shell command that deletes ``remove`` and writes ``files`` (relative path ->
    bytes) under the current directory; the contents travel base64-encoded."""
    blob = base64.b64encode(
        json.dumps(
            {
                "write": {p: base64.b64encode(b).decode() for p, b in sorted(files.items())},
                "remove": list(remove),
            }
        ).encode()
    ).decode()
    code = (
        "import base64,json,os,pathlib;"
        f"d=json.loads(base64.b64decode('{blob}'));"
        "[os.remove(p) for p in d['remove'] if os.path.isfile(p)];"
        "[(pathlib.Path(p).parent.mkdir(parents=True,exist_ok=True),"
        "pathlib.Path(p).write_bytes(base64.b64decode(b))) for p,b in d['write'].items()]"
    )
    return f'python -c "{code}"'


def run_cmd(cmd: str, cwd: str | os.PathLike, timeout_s: float = RUN_TIMEOUT_S) -> TestRun:
    """``bash -c cmd`` in ``cwd`` (a subprocess, killed with its process group after
    ``timeout_s``) -> outcomes parsed from the output."""
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.Popen(
        ["bash", "-c", cmd],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        timed_out = True
    return TestRun(
        None if timed_out else proc.returncode,
        parse_outcomes(out or ""),
        timed_out,
        time.perf_counter() - t0,
        out or "",
    )


def run_on_copy(
    repo: str | os.PathLike,
    cmd: str,
    overlay: str | os.PathLike | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
) -> TestRun:
    """Run ``cmd`` on a scratch copy of ``repo`` (with the files of ``overlay`` copied
    over it first, e.g. the oracle fix)."""
    with tempfile.TemporaryDirectory(prefix="swe-check-") as tmp:
        work = os.path.join(tmp, "repo")
        shutil.copytree(repo, work, symlinks=True)
        if overlay is not None:
            shutil.copytree(overlay, work, dirs_exist_ok=True)
        return run_cmd(cmd, work, timeout_s)


def validate_task(
    task: SweTask, timeout_s: float = RUN_TIMEOUT_S, after: TestRun | None = None
) -> SweTask:
    """Compute (if empty) or check ``fail_to_pass`` / ``pass_to_pass`` by running the
    hidden command before and after the oracle fix (``after``: that run, if done
    already); raise :class:`TaskRejected` if the hidden tests already pass before any
    edit, or the fix leaves a listed test failing."""
    before = run_on_copy(task.repo_path, task.hidden_test_cmd, None, timeout_s)
    # a run that timed out (a buggy program that never returns) has no summary: every
    # test then counts as not passing before the fix
    if task.oracle_path is None:
        failing = [t for t in task.fail_to_pass if before.outcomes.get(t) != "PASSED"]
        if task.fail_to_pass and not failing:
            raise TaskRejected(f"{task.task_id}: the hidden tests already pass before any edit")
        return task
    if after is None:
        after = run_on_copy(task.repo_path, task.hidden_test_cmd, task.oracle_path, timeout_s)
    passing_after = after.passed()
    if not task.fail_to_pass and not task.pass_to_pass:
        task.fail_to_pass = sorted(passing_after - before.passed())
        task.pass_to_pass = sorted(passing_after & before.passed())
    if not task.fail_to_pass or all(before.outcomes.get(t) == "PASSED" for t in task.fail_to_pass):
        raise TaskRejected(
            f"{task.task_id}: the hidden tests already pass before any edit "
            f"(exit code {before.exit_code})"
        )
    broken = [t for t in task.fail_to_pass + task.pass_to_pass if t not in passing_after]
    if broken or after.exit_code != 0 or after.timed_out:
        raise TaskRejected(
            f"{task.task_id}: the oracle fix leaves tests failing: "
            f"{broken[:5]} (exit code {after.exit_code})\n{after.output[-800:]}"
        )
    task.meta["validate_s"] = round(before.seconds + after.seconds, 3)
    return task
