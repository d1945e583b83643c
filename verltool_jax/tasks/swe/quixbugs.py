"""QuixBugs tasks (one per program with a pytest file) and the mutation engine that
makes more of them from the corrected programs."""

from __future__ import annotations

import ast
import json
import math
import os
import random
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from verltool_jax.tasks.swe.testing import (
    CALIBRATION_TEST_TIMEOUT_S,
    PYTEST_CONFIG_FILES,
    QUIXBUGS_CONFTEST,
    RUN_TIMEOUT_S,
    SLOW_TEST_TIMEOUT_S,
    SweTask,
    TaskRejected,
    pytest_cmd,
    restore_files_cmd,
    run_on_copy,
    validate_task,
)

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
