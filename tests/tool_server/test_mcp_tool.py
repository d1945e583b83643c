"""The mcp tool end to end: a real tool server calling a real MCP server (official SDK),
over stdio and over Streamable HTTP."""

import os
import socket
import subprocess
import sys
import time

import pytest
from support.workspace_tools import call, finish, live, tool_call

from tool_server.launcher import get_json, run_server

MCP_SERVER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "mcp_test_server.py"
)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with run_server(
        tools=["mcp"],
        timeout=10,
        workdir=str(tmp_path_factory.mktemp("wd")),
        tool_opt={"mcp_command": f"python {MCP_SERVER}", "mcp_timeout_s": 4},
        startup_timeout=120,
    ) as u:
        yield u


def test_lists_and_calls_tools(url):
    usage = {t["name"]: t["usage"] for t in get_json(url + "/tools")["tools"]}
    assert "add: Add two integers." in usage["mcp"] and "red_pixel" in usage["mcp"]
    obs, valid = call(url, "m1", tool_call("add", a=2, b=40))
    assert valid and obs["obs"] == "42" and obs["metrics"] == {"is_error": False}
    obs, valid = call(url, "m1", tool_call("red_pixel"))
    assert valid and obs["image"].startswith("data:image/png;base64,iVBOR")
    finish(url, "m1")
    assert live(url) == 0


@pytest.mark.parametrize(
    "action, expected",
    [
        (tool_call("add", a="x", b=1), "Error from MCP tool add:"),
        (tool_call("fail", message="boom"), "Error from MCP tool fail"),
        (tool_call("addd", a=1, b=2), "did you mean 'add'"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', "Invalid JSON"),
    ],
)
def test_errors_are_observations(url, action, expected):
    obs, valid = call(url, "m2", action)
    assert not valid and expected in obs["obs"], obs


def test_unknown_names_are_left_to_other_tools(url):
    obs, valid = call(url, "m3", tool_call("python_exec", code="1"))
    assert not valid and "MCP" not in obs["obs"]


def test_timeout_then_recovers(url):
    t = time.monotonic()
    obs, valid = call(url, "m4", tool_call("slow", seconds=30))
    assert not valid and "timed out after 4 s" in obs["obs"]
    assert time.monotonic() - t < 12
    obs, valid = call(url, "m4", tool_call("add", a=1, b=1))
    assert valid and obs["obs"] == "2"


def test_streamable_http_and_tool_filter(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, MCP_SERVER, "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.2)
        with run_server(
            tools=["mcp"],
            timeout=10,
            workdir=str(tmp_path),
            startup_timeout=120,
            tool_opt={"mcp_url": f"http://127.0.0.1:{port}/mcp", "mcp_tools": "add"},
        ) as u:
            obs, valid = call(u, "h1", tool_call("add", a=5, b=6))
            assert valid and obs["obs"] == "11"
            obs, valid = call(u, "h1", tool_call("fail", message="x"))  # filtered out
            assert not valid and "Error from MCP" not in obs["obs"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_misconfiguration_fails_at_startup(tmp_path):
    with pytest.raises(RuntimeError, match="mcp_url"):
        with run_server(tools=["mcp"], workdir=str(tmp_path), startup_timeout=60):
            pass
