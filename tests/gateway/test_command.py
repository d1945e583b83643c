"""Any command as the agent program (``verltool_jax/gateway/command.py``): the row on
stdin, the trajectory's endpoint in the OpenAI variables, the reward from the last line
of stdout; a failing or hung command raises (its episode becomes an error record)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import numpy as np
import pytest

from verltool_jax.gateway.command import episode_env, parse_reward, run_command

URL = "http://127.0.0.1:9/t/abc123/v1"

ECHO = """
import json, os, sys
row = json.load(sys.stdin)
print("a log line first")
names = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "VTJ_GATEWAY_EPISODE_URL", "EXTRA")
print(json.dumps({"row": row, "env": {k: os.environ.get(k) for k in names}}), file=sys.stderr)
print(json.dumps({"reward": row["extra_info"]["r"]}))
"""


def test_the_command_gets_the_row_and_endpoint_and_its_stdout_gives_the_reward(tmp_path):
    row = {"prompt": [{"role": "user", "content": "hi"}], "extra_info": {"r": np.float32(0.5)}}
    seen = tmp_path / "seen.json"
    cmd = [sys.executable, "-c", ECHO.replace("file=sys.stderr", f"file=open({str(seen)!r}, 'w')")]
    reward = asyncio.run(run_command(URL, row, cmd, env={"EXTRA": "x"}, model="policy"))
    assert reward == 0.5
    got = json.loads(seen.read_text())
    assert got["row"] == {"prompt": row["prompt"], "extra_info": {"r": 0.5}}
    assert got["env"] == {
        "OPENAI_BASE_URL": URL,
        "OPENAI_API_KEY": "abc123",
        "OPENAI_MODEL": "policy",
        "VTJ_GATEWAY_EPISODE_URL": "http://127.0.0.1:9/t/abc123",
        "EXTRA": "x",
    }
    assert episode_env(URL + "/", "m")["OPENAI_API_KEY"] == "abc123"


def test_parse_reward():
    assert parse_reward("log\n0.25\n\n") == 0.25
    assert parse_reward('{"reward": 1}') == 1.0
    assert parse_reward('{"reward": true}') is None
    assert parse_reward('{"other": 1}') is None
    assert parse_reward("done") is None
    assert parse_reward("") is None


def test_a_failing_command_raises_with_its_stderr():
    cmd = [sys.executable, "-c", "import sys; print('it broke', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="exited 3: it broke"):
        asyncio.run(run_command(URL, {}, cmd))
    with pytest.raises(ValueError, match="command is empty"):
        asyncio.run(run_command(URL, {}, []))


def test_a_hung_command_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(TimeoutError, match="timeout_s=5"):
        asyncio.run(run_command(URL, {}, [sys.executable, "-c", script], timeout_s=5))
    child = int(pid_file.read_text())
    for _ in range(50):  # the SIGKILL of the group reaches the child at once; reaped soon
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":  # killed, not yet reaped by init
                break
        asyncio.run(asyncio.sleep(0.1))
    else:
        raise AssertionError("the command's child outlived the timeout")
