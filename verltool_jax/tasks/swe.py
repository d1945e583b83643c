"""SWE tasks: repository snapshots with a statement and a hidden test command.

A task (:class:`SweTask`) is a directory ``<out>/tasks/<task_id>/`` holding ``repo/`` (the
snapshot the agent's workspace is copied from: ``extra_info["repo_path"]``) and
``oracle/`` (the known fix, files relative to the repo; never shown to the agent), plus
the statement, the visible test command (what the agent's ``run_tests`` runs) and the
hidden test command (what decides the reward).

The hidden command first restores the pristine test files (they are embedded in the
command, base64-encoded, and written over whatever the agent left; pytest configuration
files the agent may have added at the root are removed), then runs exactly the tests that
must pass: ``FAIL_TO_PASS`` (fail before the fix, pass after) and ``PASS_TO_PASS`` (pass
on both). The SWE reward is 1 iff that run exits 0 with no failure or error and at least
``len(FAIL_TO_PASS) + len(PASS_TO_PASS)`` tests passed
(:func:`verltool_jax.rewards.swe_reward.swe_reward_from_result`).

Sources:

* QuixBugs (:func:`quixbugs_tasks`): one task per program that has a pytest file (40); the
  repo keeps QuixBugs' own layout (``python_programs/<name>.py`` = the buggy program,
  ``python_testcases/test_<name>.py``, ``json_testcases/<name>.json``) with our
  ``conftest.py`` (the upstream one needs ``--correct``; ours always tests
  ``python_programs`` and skips the tests marked slow). The oracle is the corrected
  program. More tasks come from mutating the corrected programs (:func:`mutants`: one
  AST edit each: a swapped arithmetic/comparison/boolean operator, an integer constant
  +-1, or a negated ``if``/``while`` condition), kept only if the mutant makes a test fail.
* SWE-bench-style JSONL (:func:`swebench_tasks`): ``repo``, ``instance_id``,
  ``base_commit``, ``problem_statement``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``
  (lists or JSON strings), optional ``patch`` (the oracle) and ``test_cmd``; the snapshot is
  a checkout of ``base_commit`` from a local mirror ``<mirrors>/<owner>__<name>`` (or
  ``<mirrors>/<owner>/<name>``); the hidden command applies ``test_patch`` with
  ``git apply`` before running the tests.

Validation at data preparation runs the hidden command on a scratch copy in a subprocess
with a timeout (QuixBugs is trusted data; the agent's code only ever runs in the tool
server's sandbox). For QuixBugs the per-test limit is 3x the fixed program's test time,
at least 5 s, so a buggy program that never returns is cut without cutting a slow
correct test (levenshtein's takes ~10 s on a busy machine). A task whose ``FAIL_TO_PASS`` tests already pass, or whose fix does not
make every listed test pass, is rejected with the reason (:class:`TaskRejected`).

    python -m verltool_jax.tasks.swe --quixbugs-dir DIR --out outputs/swe [--mutants 2]
"""

from __future__ import annotations

import argparse
import ast
import base64
import importlib.util
import json
import math
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verltool_jax.data.readers import write_rows
from verltool_jax.tasks import TaskFiles

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


# ----------------------------------------------------------------------------- QuixBugs


def quixbugs_programs(quix_dir: str | os.PathLike) -> list[str]:
    """Programs with a buggy version, a corrected version and a pytest file."""
    q = Path(quix_dir)
    out = []
    for test in sorted((q / "python_testcases").glob("test_*.py")):
        name = test.stem[len("test_") :]
        if (q / "python_programs" / f"{name}.py").is_file() and (
            q / "correct_python_programs" / f"{name}.py"
        ).is_file():
            out.append(name)
    if not out:
        raise ValueError(
            f"no QuixBugs program under {q} (expected python_programs/, "
            "correct_python_programs/, python_testcases/test_<name>.py)"
        )
    return out


def _quix_test_files(q: Path, name: str) -> dict[str, bytes]:
    files = {
        f"python_testcases/test_{name}.py": (
            q / "python_testcases" / f"test_{name}.py"
        ).read_bytes(),
        "conftest.py": QUIXBUGS_CONFTEST.encode(),
    }
    for helper in ("load_testdata.py", "node.py"):
        p = q / "python_testcases" / helper
        if p.is_file():
            files[f"python_testcases/{helper}"] = p.read_bytes()
    js = q / "json_testcases" / f"{name}.json"
    if js.is_file():
        files[f"json_testcases/{name}.json"] = js.read_bytes()
    return files


def _docstring(source: str) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    texts = [
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Constant)
        and isinstance(n.value.value, str)
    ]
    return "\n".join(t.strip("\n") for t in texts).strip()


def _functions(source: str) -> list[str]:
    return [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]


def quixbugs_statement(name: str, spec: str, functions: Sequence[str]) -> str:
    what = f"`{functions[0]}`" if functions else "the program"
    return (
        f"The tests in `python_testcases/test_{name}.py` fail: {what} in "
        f"`python_programs/{name}.py` has a bug. Find it and fix it by editing "
        f"`python_programs/{name}.py` only (do not change the tests).\n\n"
        + (f"What the program should do:\n{spec}\n" if spec else "")
    )


def write_quixbugs_task(
    quix_dir: str | os.PathLike,
    name: str,
    out_root: str | os.PathLike,
    program: str | None = None,
    task_id: str | None = None,
    source: str = "quixbugs",
    validate: bool = True,
    timeout_s: float = RUN_TIMEOUT_S,
) -> SweTask:
    """One QuixBugs task: the repo with ``program`` (default: the buggy version) as
    ``python_programs/<name>.py``; the oracle is the corrected program. Validated (and
    FAIL_TO_PASS / PASS_TO_PASS computed) unless ``validate=False``."""
    q = Path(quix_dir)
    buggy = (q / "python_programs" / f"{name}.py").read_text()
    correct = (q / "correct_python_programs" / f"{name}.py").read_text()
    program = buggy if program is None else program
    task_id = task_id or name
    root = Path(out_root) / "tasks" / task_id
    if root.exists():
        shutil.rmtree(root)
    repo = root / "repo"
    test_files = _quix_test_files(q, name)
    for rel, data in test_files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    (repo / "python_programs").mkdir(parents=True, exist_ok=True)
    (repo / "python_programs" / f"{name}.py").write_text(program)
    node = q / "python_programs" / "node.py"
    if node.is_file():
        shutil.copy(node, repo / "python_programs" / "node.py")
    (root / "oracle" / "python_programs").mkdir(parents=True)
    (root / "oracle" / "python_programs" / f"{name}.py").write_text(correct)

    def commands(per_test_s: int) -> tuple[str, str]:
        run = pytest_cmd([f"python_testcases/test_{name}.py"], per_test_s)
        return run, restore_files_cmd(test_files, PYTEST_CONFIG_FILES) + " && " + run

    test_cmd, hidden_cmd = commands(SLOW_TEST_TIMEOUT_S)
    task = SweTask(
        task_id=task_id,
        repo_path=str(repo),
        statement=quixbugs_statement(name, _docstring(buggy), _functions(correct)),
        test_cmd=test_cmd,
        hidden_test_cmd=hidden_cmd,
        oracle_path=str(root / "oracle"),
        source=source,
        meta={"program": name},
    )
    if validate:
        try:
            # time the fixed program first: the per-test limit is 3x that run's wall time
            # (at least SLOW_TEST_TIMEOUT_S), so a correct but slow test is never cut while
            # a buggy program that never returns is stopped soon
            after = run_on_copy(
                repo, commands(CALIBRATION_TEST_TIMEOUT_S)[1], task.oracle_path, timeout_s
            )
            per_test = max(SLOW_TEST_TIMEOUT_S, math.ceil(3 * after.seconds))
            task.test_cmd, task.hidden_test_cmd = commands(per_test)
            task.meta["per_test_timeout_s"] = per_test
            validate_task(task, timeout_s, after)
        except TaskRejected:
            shutil.rmtree(root, ignore_errors=True)
            raise
    (root / "task.json").write_text(json.dumps(asdict(task), indent=1))
    return task


# ----------------------------------------------------------------------------- mutation

_SWAPS = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.And: ast.Or,
    ast.Or: ast.And,
}


def _sites(tree: ast.AST) -> list[tuple[str, int]]:
    """Mutation sites as (kind, index of the node in ast.walk order)."""
    out = []
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _SWAPS:
            out.append(("operator", i))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _SWAPS:
            out.append(("operator", i))
        elif isinstance(node, ast.BoolOp) and type(node.op) in _SWAPS:
            out.append(("operator", i))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append(("off_by_one+", i))
            out.append(("off_by_one-", i))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            out.append(("condition", i))
    return out


def _apply(tree: ast.AST, kind: str, index: int) -> str:
    for i, node in enumerate(ast.walk(tree)):
        if i != index:
            continue
        if kind == "operator":
            if isinstance(node, ast.Compare):
                node.ops = [_SWAPS[type(node.ops[0])]()]
            else:
                node.op = _SWAPS[type(node.op)]()
        elif kind.startswith("off_by_one"):
            node.value = node.value + (1 if kind.endswith("+") else -1)
        elif kind == "condition":
            node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
        break
    return ast.unparse(ast.fix_missing_locations(tree))


def mutants(source: str) -> list[tuple[str, str]]:
    """Every single-site mutant of ``source`` as (description, new source): operator
    swaps (+/-, *///, </<=, >/>=, ==/!=, and/or), integer constants +-1, negated
    if/while conditions. Mutants equal to the original are dropped."""
    base = ast.unparse(ast.parse(source))
    out = []
    for kind, idx in _sites(ast.parse(source)):
        new = _apply(ast.parse(source), kind, idx)
        if new != base:
            out.append((f"{kind}@node{idx}", new))
    return out


def write_mutant_tasks(
    quix_dir: str | os.PathLike,
    name: str,
    out_root: str | os.PathLike,
    per_program: int,
    seed: int = 0,
    timeout_s: float = 30.0,
    max_tries: int = 12,
) -> tuple[list[SweTask], list[str]]:
    """Up to ``per_program`` mutant tasks of program ``name`` (from its corrected
    version), each checked to make at least one test fail; returns (tasks, rejections)."""
    correct = (Path(quix_dir) / "correct_python_programs" / f"{name}.py").read_text()
    cands = mutants(correct)
    random.Random(f"{seed}-{name}").shuffle(cands)
    tasks, rejected = [], []
    for k, (desc, src) in enumerate(cands[:max_tries]):
        if len(tasks) >= per_program:
            break
        try:
            tasks.append(
                write_quixbugs_task(
                    quix_dir,
                    name,
                    out_root,
                    program=src,
                    task_id=f"{name}__mut{k}",
                    source="quixbugs-mutant",
                    timeout_s=timeout_s,
                )
            )
            tasks[-1].meta["mutation"] = desc
        except TaskRejected as e:
            rejected.append(f"{desc}: {str(e).splitlines()[0]}")
    return tasks, rejected


def quixbugs_tasks(
    quix_dir: str | os.PathLike,
    out_root: str | os.PathLike,
    programs: Sequence[str] | None = None,
    mutants_per_program: int = 0,
    seed: int = 0,
    timeout_s: float = RUN_TIMEOUT_S,
) -> tuple[list[SweTask], list[str]]:
    """The QuixBugs tasks (plus mutants) of ``programs`` (default: all) -> (tasks,
    rejection reasons)."""
    names = list(programs) if programs else quixbugs_programs(quix_dir)
    tasks, rejected = [], []
    for name in names:
        try:
            tasks.append(write_quixbugs_task(quix_dir, name, out_root, timeout_s=timeout_s))
        except TaskRejected as e:
            rejected.append(str(e).splitlines()[0])
        if mutants_per_program > 0:
            t, r = write_mutant_tasks(quix_dir, name, out_root, mutants_per_program, seed)
            tasks += t
            rejected += [f"{name} mutant {x}" for x in r]
    return tasks, rejected


# ----------------------------------------------------------------------------- SWE-bench


def _id_list(value, field_name: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(
                f"{where}: field {field_name!r} must be a list of test ids "
                f"(or its JSON text), got {value[:80]!r}"
            ) from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: field {field_name!r} must be a list of test ids")
    return value


def find_mirror(mirrors: str | os.PathLike, repo: str) -> Path:
    """The local mirror of ``owner/name``: ``<mirrors>/<owner>__<name>`` or
    ``<mirrors>/<owner>/<name>`` (a git repository, bare or not)."""
    owner, _, name = repo.partition("/")
    for cand in (
        Path(mirrors) / f"{owner}__{name}",
        Path(mirrors) / owner / name,
        Path(mirrors) / f"{name}.git",
    ):
        if cand.is_dir():
            return cand
    raise ValueError(
        f"no local mirror of {repo!r} under {mirrors} (looked for "
        f"{owner}__{name}/ and {owner}/{name}/)"
    )


def read_swebench_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a SWE-bench-style JSONL, checked for the required fields."""
    need = (
        "repo",
        "base_commit",
        "problem_statement",
        "test_patch",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
    )
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            rec = json.loads(line)
            missing = [k for k in need if k not in rec]
            if missing:
                raise ValueError(
                    f"{path} line {i + 1}: missing field(s) {missing}; a "
                    f"SWE-bench record needs {list(need)}"
                )
            rec["FAIL_TO_PASS"] = _id_list(rec["FAIL_TO_PASS"], "FAIL_TO_PASS", f"{path}:{i + 1}")
            rec["PASS_TO_PASS"] = _id_list(rec["PASS_TO_PASS"], "PASS_TO_PASS", f"{path}:{i + 1}")
            rec.setdefault("instance_id", f"{rec['repo'].replace('/', '__')}-{i}")
            out.append(rec)
    return out


def _git(*args: str, cwd=None) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed: {r.stderr.strip()[:300]}")
    return r.stdout


def write_swebench_task(
    rec: dict,
    mirrors: str | os.PathLike,
    out_root: str | os.PathLike,
    validate: bool = True,
    timeout_s: float = RUN_TIMEOUT_S,
) -> SweTask:
    """Check out ``base_commit`` of the record's mirror as the task repo; the hidden
    command applies ``test_patch`` and runs FAIL_TO_PASS + PASS_TO_PASS; ``patch`` (if
    given) becomes the oracle."""
    mirror = find_mirror(mirrors, rec["repo"])
    task_id = re.sub(r"[^A-Za-z0-9_.-]", "_", rec["instance_id"])
    root = Path(out_root) / "tasks" / task_id
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    repo = root / "repo"
    _git("clone", "-q", "--no-checkout", str(mirror), str(repo))
    _git("-c", "advice.detachedHead=false", "checkout", "-q", rec["base_commit"], cwd=repo)
    tests = rec["FAIL_TO_PASS"] + rec["PASS_TO_PASS"]
    run = rec.get("test_cmd") or pytest_cmd(tests, SWEBENCH_TEST_TIMEOUT_S)
    patch_file = ".swe_test_patch.diff"
    base = shlex.quote(rec["base_commit"])
    reset = "".join(
        f" && (git checkout -q {base} -- {shlex.quote(p)} 2>/dev/null || rm -f {shlex.quote(p)})"
        for p in _patched_paths(rec["test_patch"])
    )
    hidden = (
        restore_files_cmd({patch_file: rec["test_patch"].encode()}, PYTEST_CONFIG_FILES)
        + reset
        + f" && git apply {patch_file} && rm -f {patch_file} && {run}"
    )
    oracle = None
    if rec.get("patch"):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "w"
            shutil.copytree(repo, work, symlinks=True)
            (work / "fix.diff").write_text(rec["patch"])
            _git("apply", "fix.diff", cwd=work)
            (work / "fix.diff").unlink()
            oracle = root / "oracle"
            for p in _patched_paths(rec["patch"]):
                if (work / p).is_file():
                    (oracle / p).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(work / p, oracle / p)
    task = SweTask(
        task_id=task_id,
        repo_path=str(repo),
        statement=rec["problem_statement"],
        test_cmd=rec.get("test_cmd") or pytest_cmd([], SWEBENCH_TEST_TIMEOUT_S),
        hidden_test_cmd=hidden,
        fail_to_pass=list(rec["FAIL_TO_PASS"]),
        pass_to_pass=list(rec["PASS_TO_PASS"]),
        oracle_path=str(oracle) if oracle else None,
        source="swebench",
        meta={"repo": rec["repo"], "base_commit": rec["base_commit"]},
    )
    if validate:
        try:
            validate_task(task, timeout_s)
        except TaskRejected:
            shutil.rmtree(root, ignore_errors=True)
            raise
    (root / "task.json").write_text(json.dumps(asdict(task), indent=1))
    return task


def _patched_paths(diff: str) -> list[str]:
    return sorted({m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", diff, re.M)})


def swebench_tasks(
    jsonl: str | os.PathLike,
    mirrors: str | os.PathLike,
    out_root: str | os.PathLike,
    validate: bool = True,
) -> tuple[list[SweTask], list[str]]:
    """Tasks of every record of ``jsonl`` -> (tasks, rejection reasons)."""
    tasks, rejected = [], []
    for rec in read_swebench_jsonl(jsonl):
        try:
            tasks.append(write_swebench_task(rec, mirrors, out_root, validate))
        except (TaskRejected, ValueError) as e:
            rejected.append(f"{rec['instance_id']}: {str(e).splitlines()[0]}")
    return tasks, rejected


# ----------------------------------------------------------------------------- rows

TOOLS_TEXT = (
    "You are working in a repository (the current directory). Tools, one call per turn:\n"
    "- a shell: <bash>COMMAND</bash> (the shell keeps its directory and variables);\n"
    '- the file editor: <tool_call>{"name": "file_editor", "arguments": {"command": '
    '"view" | "create" | "str_replace" | "insert", "path": "...", ...}}</tool_call> '
    '(str_replace takes "old_str" and "new_str");\n'
    '- the tests: <tool_call>{"name": "run_tests", "arguments": {}}</tool_call>.\n'
    "When you are done, answer with <answer>done</answer>."
)


def make_row(task: SweTask, split: str = "eval", index: int = 0) -> dict:
    """One verl-layout row: the statement as the prompt, the test commands and the
    workspace source in ``extra_info`` (what the tool server gets)."""
    return {
        "prompt": [
            {"role": "system", "content": TOOLS_TEXT},
            {"role": "user", "content": task.statement},
        ],
        "data_source": DATA_SOURCE,
        "ability": "swe",
        "reward_model": {
            "style": "rule",
            "ground_truth": {
                "fail_to_pass": list(task.fail_to_pass),
                "pass_to_pass": list(task.pass_to_pass),
            },
        },
        "extra_info": {
            "task_id": task.task_id,
            "repo_path": task.repo_path,
            "test_cmd": task.test_cmd,
            "hidden_test_cmd": task.hidden_test_cmd,
            "source": task.source,
            "split": split,
            "index": index,
        },
    }


@dataclass(frozen=True)
class QuixBugsTask:
    """The ``task`` config section of the SWE family on QuixBugs (``configs/vt_swe.py``)."""

    name: str = "quixbugs"
    quixbugs_dir: str = ""  # required: the QuixBugs folder
    programs: tuple[str, ...] = ()  # empty: all 40 programs with pytest files
    mutants_per_program: int = 3  # train tasks per program
    seed: int = 0


TASK_CONFIG = QuixBugsTask


def write_task_from_config(config, out_dir: str | os.PathLike) -> TaskFiles:
    """QuixBugs tasks from ``config.task.quixbugs_dir`` (``programs`` if non-empty;
    ``mutants_per_program`` mutants each): eval rows = the original bugs, train rows =
    the mutants (or the original bugs when there are none)."""
    t = config.task
    if not t.quixbugs_dir:
        raise ValueError(
            "task.quixbugs_dir is empty: pass the QuixBugs folder "
            "(python_programs/, correct_python_programs/, python_testcases/), "
            "e.g. --config.task.quixbugs_dir=/data/quixbugs"
        )
    out = Path(out_dir)
    tasks, rejected = quixbugs_tasks(
        t.quixbugs_dir, out, tuple(t.programs) or None, int(t.mutants_per_program), int(t.seed)
    )
    originals = [x for x in tasks if x.source == "quixbugs"]
    mutated = [x for x in tasks if x.source != "quixbugs"] or originals
    if not originals:
        raise ValueError("no usable QuixBugs task:\n" + "\n".join(rejected))
    (out / "rejected.txt").write_text("\n".join(rejected) + "\n")
    return TaskFiles(
        train=write_rows(
            [make_row(x, "train", i) for i, x in enumerate(mutated)], out / "train.parquet"
        ),
        eval=write_rows(
            [make_row(x, "eval", i) for i, x in enumerate(originals)], out / "eval.parquet"
        ),
    )


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quixbugs-dir", default="")
    ap.add_argument("--swebench-jsonl", default="")
    ap.add_argument("--mirrors", default="", help="folder of local git mirrors (SWE-bench)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--programs", default="", help="comma-separated QuixBugs programs")
    ap.add_argument("--mutants", type=int, default=0, help="mutant tasks per program")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(None if argv is None else list(argv))
    t0 = time.perf_counter()
    tasks, rejected = [], []
    if args.quixbugs_dir:
        progs = [p for p in args.programs.split(",") if p] or None
        t, r = quixbugs_tasks(args.quixbugs_dir, args.out, progs, args.mutants, args.seed)
        tasks += t
        rejected += r
    if args.swebench_jsonl:
        if not args.mirrors:
            ap.error("--swebench-jsonl needs --mirrors")
        t, r = swebench_tasks(args.swebench_jsonl, args.mirrors, args.out)
        tasks += t
        rejected += r
    if not tasks:
        print("no task written", *rejected, sep="\n")
        return 1
    rows = [make_row(x, "eval", i) for i, x in enumerate(tasks)]
    path = write_rows(rows, Path(args.out) / "tasks.parquet")
    by_source: dict[str, int] = {}
    for x in tasks:
        by_source[x.source] = by_source.get(x.source, 0) + 1
    print(f"tasks: {len(tasks)} {by_source} -> {path}")
    for r in rejected:
        print(f"  rejected: {r}")
    print(f"time: {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
