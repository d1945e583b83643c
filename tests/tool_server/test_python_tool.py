"""python_code tool: parsing, output formatting, stateless and stateful runs, through a
real server and the real sandbox."""

from __future__ import annotations

import sys

import pytest
from support.tool_server import obs_text, one

from tool_server.launcher import get_json, run_server
from tool_server.protocol import RESUMED_FIELD
from tool_server.python_pool import RunResult
from tool_server.sandbox import ResourceLimits
from tool_server.tools.python_code import clean_paths, extract_code, format_result


@pytest.fixture(scope="module")
def server():
    with run_server(["python_code"], timeout=4, workers=2) as url:
        yield url


def py(url, code, tid="p", **kw):
    obs, done, valid = one(url, tid, f"<python>{code}</python>", **kw)
    assert valid and not done
    return obs_text(obs)


def test_extract_code_tags_fences_and_order():
    assert extract_code("a <python>x=1</python> b <python>print(x)</python>") == "x=1\nprint(x)"
    assert (
        extract_code("```python\nprint(2)\n```\ntext\n```py\nprint(3)\n```") == "print(2)\nprint(3)"
    )
    assert extract_code("<python>a</python>```python\nb\n```") == "a"  # tags win
    assert extract_code("no code here ```bash\nls\n```") is None
    assert extract_code("<python>unclosed") is None


def test_format_result_notes():
    lim = ResourceLimits(cpu_s=2, wall_s=3)
    assert format_result(RunResult(stdout="hi\n"), lim) == "hi\n"
    t = format_result(RunResult(stdout="x", stderr="err\n"), lim)
    assert t == "x\nerr\n"
    assert "3 s time limit" in format_result(RunResult(timed_out=True), lim)
    assert "SIGXCPU" in format_result(RunResult(signal=24), lim)
    assert "[output truncated]" in format_result(RunResult(stdout="a", truncated=True), lim)


def test_clean_paths_removes_host_prefixes():
    text = (
        f'  File "{sys.base_prefix}/lib/python3.11/json/decoder.py", line 3\n'
        '  File "/workspace/run_ab12cd/data.txt"'
    )
    out = clean_paths(text)
    assert sys.base_prefix not in out and "lib/python3.11/json/decoder.py" in out
    assert 'File "data.txt"' in out


def test_happy_path_and_multiple_blocks(server):
    assert py(server, "print(1+1)") == "2\n"
    obs, _, valid = one(
        server, "p", "Let me compute.\n<python>x = 6</python>\nthen\n<python>print(x * 7)</python>"
    )
    assert valid and obs == "42\n"
    obs, _, valid = one(server, "p", "```python\nimport math\nprint(math.factorial(5))\n```")
    assert valid and obs == "120\n"


def test_stdout_then_stderr_and_clean_traceback(server):
    out = py(server, "print('before')\nimport json\njson.loads('{')")
    assert out.startswith("before\n")
    assert 'File "main.py", line 3' in out and "JSONDecodeError" in out
    assert sys.base_prefix not in out and sys.prefix not in out and "/workspace" not in out


def test_syntax_error_and_sys_exit(server):
    assert "SyntaxError" in py(server, "def f(:\n  pass")
    assert py(server, "import sys; print('a'); sys.exit(0)") == "a\n"
    assert "bye" in py(server, "import sys; sys.exit('bye')")


def test_endless_output_is_cut_off_early(server):
    import time

    t0 = time.monotonic()
    out = py(server, "while True: print('spam' * 100)")
    assert time.monotonic() - t0 < 2.5  # well before the 3.5 s wall limit
    assert out.startswith("spam") and "printed too much and was stopped" in out
    assert "truncated" in out and len(out) <= 8192


def test_empty_block_and_no_output(server):
    obs, _, valid = one(server, "p", "<python>   </python>")
    assert valid and "empty" in obs_text(obs)
    assert py(server, "x = 1") == ""


def test_libraries_from_the_environment_import(server):
    assert py(server, "import numpy as np; print(int(np.arange(5).sum()))") == "10\n"


def test_stateless_by_default(server):
    py(server, "secret_var = 5", tid="s")
    assert "NameError" in py(server, "print(secret_var)", tid="s")


def test_stateful_mode_keeps_variables_until_finish(server):
    assert py(server, "counter = 41", tid="k", extra_fields={"stateful": True}) == ""
    assert (
        py(server, "counter += 1; print(counter)", tid="k", extra_fields={"stateful": True})
        == "42\n"
    )
    # another trajectory has its own interpreter
    assert "NameError" in py(server, "print(counter)", tid="k2", extra_fields={"stateful": True})
    assert get_json(server + "/health")["live_trajectories"] >= 2
    assert one(server, "k", "", finish=True)[:2] == ("", True)
    assert "NameError" in py(server, "print(counter)", tid="k", extra_fields={"stateful": True})
    one(server, "k", "", finish=True)
    one(server, "k2", "", finish=True)


def test_a_resumed_trajectory_is_told_when_its_state_was_reset(server):
    """The first call of a trajectory resumed from a checkpoint carries its earlier
    actions: a server that holds exactly the state they built keeps it; one that lost it
    (restarted) or holds more (calls after the checkpoint) frees it and says so."""
    first = "<python>v = 7</python>"

    def resumed(n, stateful=True):
        return {"stateful": stateful, RESUMED_FIELD: {"tool_calls": n, "actions": [first] * n}}

    py(server, "v = 7", tid="rs", extra_fields={"stateful": True})
    assert py(server, "print(v)", tid="rs", extra_fields=resumed(1)) == "7\n"  # kept
    out = py(server, "print(v)", tid="rs", extra_fields=resumed(1))  # the server is ahead
    assert out.startswith("[tool state was reset") and "python_code" in out, out
    assert "NameError" in out  # run on a fresh interpreter
    out = py(server, "print(1)", tid="rs-new", extra_fields=resumed(1))  # never seen here
    assert out.startswith("[tool state was reset") and out.endswith("\n1\n"), out
    assert py(server, "print(2)", tid="rs-sl", extra_fields=resumed(1, False)) == "2\n"
    assert py(server, "print(3)", tid="rs-0", extra_fields=resumed(0)) == "3\n"
    assert get_json(server + "/health")["states_reset"] == 2
    for tid in ("rs", "rs-new", "rs-sl", "rs-0"):
        one(server, tid, "", finish=True)


def test_stateful_timeout_loses_state_but_recovers(server):
    ef = {"stateful": True}
    py(server, "v = 1", tid="kt", extra_fields=ef)
    out = py(server, "import time; time.sleep(60)", tid="kt", extra_fields=ef)
    assert "TimeoutError" in out or "timed out" in out
    out = py(server, "print('v' in globals())", tid="kt", extra_fields=ef)
    assert "False" in out and "variables are lost" in out
    one(server, "kt", "", finish=True)


def test_stateful_flag_on_the_server_and_kernel_cap():
    opts = {"python_stateful": "true", "python_max_kernels": 2}
    with run_server(["python_code"], workers=1, tool_opt=opts) as url:
        py(url, "a = 3", tid="z")
        assert py(url, "print(a * 2)", tid="z") == "6\n"
        py(url, "b = 1", tid="y")
        assert py(url, "print(a)", tid="z") == "3\n"  # z used last; y is the oldest
        py(url, "c = 1", tid="x")  # third interpreter: y is freed
        assert "NameError" in py(url, "print(b)", tid="y")  # new interpreter: z is freed
        assert py(url, "print(c)", tid="x") == "1\n"


def test_bad_tool_option_is_a_clear_startup_error():
    with pytest.raises(RuntimeError, match="python_memory_mb"):
        with run_server(["python_code"], workers=1, tool_opt={"python_memory_mb": "lots"}):
            pass
