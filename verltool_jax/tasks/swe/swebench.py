"""SWE-bench-style tasks from a JSONL file and local git mirrors."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import asdict
from pathlib import Path

from verltool_jax.tasks.swe.testing import (
    PYTEST_CONFIG_FILES,
    RUN_TIMEOUT_S,
    SWEBENCH_TEST_TIMEOUT_S,
    SweTask,
    TaskRejected,
    pytest_cmd,
    restore_files_cmd,
    validate_task,
)

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
