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

from verltool_jax.tasks.swe.quixbugs import (
    mutants,
    quixbugs_programs,
    quixbugs_statement,
    quixbugs_tasks,
    write_mutant_tasks,
    write_quixbugs_task,
)
from verltool_jax.tasks.swe.swebench import (
    find_mirror,
    read_swebench_jsonl,
    swebench_tasks,
    write_swebench_task,
)
from verltool_jax.tasks.swe.task import (
    TASK_CONFIG,
    TOOLS_TEXT,
    QuixBugsTask,
    main,
    make_row,
    write_task_from_config,
)
from verltool_jax.tasks.swe.testing import (
    CALIBRATION_TEST_TIMEOUT_S,
    DATA_SOURCE,
    PYTEST_CONFIG_FILES,
    QUIXBUGS_CONFTEST,
    RUN_TIMEOUT_S,
    SLOW_TEST_TIMEOUT_S,
    SWEBENCH_TEST_TIMEOUT_S,
    SweTask,
    TaskRejected,
    TestRun,
    parse_outcomes,
    pytest_cmd,
    restore_files_cmd,
    run_cmd,
    run_on_copy,
    validate_task,
)

__all__ = [
    "CALIBRATION_TEST_TIMEOUT_S",
    "DATA_SOURCE",
    "PYTEST_CONFIG_FILES",
    "QUIXBUGS_CONFTEST",
    "QuixBugsTask",
    "RUN_TIMEOUT_S",
    "SLOW_TEST_TIMEOUT_S",
    "SWEBENCH_TEST_TIMEOUT_S",
    "SweTask",
    "TASK_CONFIG",
    "TOOLS_TEXT",
    "TaskRejected",
    "TestRun",
    "find_mirror",
    "main",
    "make_row",
    "mutants",
    "parse_outcomes",
    "pytest_cmd",
    "quixbugs_programs",
    "quixbugs_statement",
    "quixbugs_tasks",
    "read_swebench_jsonl",
    "restore_files_cmd",
    "run_cmd",
    "run_on_copy",
    "swebench_tasks",
    "validate_task",
    "write_mutant_tasks",
    "write_quixbugs_task",
    "write_swebench_task",
    "write_task_from_config",
]
