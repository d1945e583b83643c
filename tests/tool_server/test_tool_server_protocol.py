"""Protocol conformance, routing, state freeing and fault handling of the tool server
(a real server subprocess; the tools are the real sql tool and a tool added from a
temporary file through --tool-dir, as docs/adding_a_tool.md describes)."""

from __future__ import annotations

import sqlite3
import time

import pytest
from support.tool_server import one, write_faulty_tool

from tool_server.kit.observations import truncate_text
from tool_server.launcher import get_json, post_json, run_server
from tool_server.protocol import RESUMED_FIELD, ProtocolError, parse_request


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tool_dir = write_faulty_tool(str(tmp_path_factory.mktemp("tools")))
    with run_server(
        ["faulty", "sql", "synctool"],
        tool_dir=[tool_dir],
        timeout=1.5,
        max_obs_length=500,
        state_ttl=1.0,
        sweep_interval=0.2,
        workers=1,
    ) as url:
        yield url


def post(url, body):
    return post_json(url + "/get_observation", body)


def test_health_and_tools(server):
    h = get_json(server + "/health")
    assert h["status"] == "ok"
    assert h["tools"] == ["faulty", "sql", "synctool"]
    assert h["uptime_s"] >= 0 and "in_flight" in h
    tools = get_json(server + "/tools")["tools"]
    assert [t["name"] for t in tools] == ["faulty", "sql", "synctool"]
    assert all(t["usage"] for t in tools)
    sql = next(t for t in tools if t["name"] == "sql")["schema"]["function"]
    assert sql["name"] == "sql" and sql["parameters"]["required"] == ["query"]


def test_same_length_and_order_with_mixed_tools(server, tmp_path):
    db = tmp_path / "a.db"
    with sqlite3.connect(db) as c:
        c.execute("create table t(x)")
        c.execute("insert into t values (42)")
    body = {
        "trajectory_ids": ["t1", "t2", "t3", "t4"],
        "actions": ["<echo>hi", "<sql>select x from t</sql>", "nothing here", "<sync>a"],
        "extra_fields": [{}, {"db_path": str(db)}, None, {}],
    }
    status, out = post(server, body)
    assert status == 200
    assert set(out) == {"observations", "dones", "valids"}
    assert all(len(out[k]) == 4 for k in out)
    o = out["observations"]
    assert o[0] == {"obs": "t1|<echo>hi", "reward": 0.5, "metrics": {"n": 8}}
    assert "42" in o[1] and out["valids"][1]
    assert o[2]["obs"] == "" and "no tool accepted" in o[2]["invalid_reason"]
    assert out["valids"][2] is False and out["dones"][2] is False
    assert o[3] == "sync:t4"


def test_routing_first_tool_wins_in_tools_order(tmp_path):
    d = tmp_path / "tools"
    d.mkdir()
    (d / "greedy.py").write_text(
        "from tool_server.kit.base import BaseTool\n"
        "class Greedy(BaseTool):\n"
        "    name = 'greedy'\n    usage = 'accepts everything'\n"
        "    def parse_action(self, a): return a, True\n"
        "    def conduct_action(self, t, p, e): return 'greedy', False, True\n"
    )
    write_faulty_tool(str(d))
    with run_server(["faulty", "greedy"], tool_dir=[str(d)]) as url:
        assert one(url, "a", "<echo>x")[0]["obs"] == "a|<echo>x"
        assert one(url, "a", "plain text")[0] == "greedy"
    with run_server(["greedy", "faulty"], tool_dir=[str(d)]) as url:
        assert one(url, "a", "<echo>x")[0] == "greedy"


def test_finish_frees_state_and_returns_empty_done(server):
    assert one(server, "f1", "<count/>")[0] == "count=1"
    assert one(server, "f1", "<count/>")[0] == "count=2"
    obs, done, valid = one(server, "f1", "<count/>", finish=True)
    assert (obs, done, valid) == ("", True, True)
    assert one(server, "f1", "<count/>")[0] == "count=1"  # state was freed


def test_is_last_step_frees_state_after_running(server):
    assert one(server, "l1", "<count/>")[0] == "count=1"
    assert one(server, "l1", "<count/>", is_last_step=True)[0] == "count=2"
    assert one(server, "l1", "<count/>")[0] == "count=1"


def test_done_from_tool_frees_state(server):
    one(server, "d1", "<count/>")
    assert one(server, "d1", "<done/>")[1:] == (True, True)
    assert one(server, "d1", "<count/>")[0] == "count=1"


def test_idle_ttl_sweeper_frees_state(server):
    assert one(server, "ttl", "<count/>")[0] == "count=1"
    assert get_json(server + "/health")["live_trajectories"] >= 1
    time.sleep(1.8)  # ttl 1 s, sweep every 0.2 s
    assert one(server, "ttl", "<count/>")[0] == "count=1"
    assert get_json(server + "/health")["freed_by_ttl"] >= 1


def test_same_trajectory_twice_in_one_request_runs_in_order(server):
    status, out = post(server, {"trajectory_ids": ["o", "o", "o"], "actions": ["<count/>"] * 3})
    assert out["observations"] == ["count=1", "count=2", "count=3"]
    one(server, "o", "", finish=True)


def test_long_observation_is_truncated_with_marker(server):
    obs = one(server, "big", "<big/>")[0]
    assert len(obs) <= 500 and "truncated" in obs
    assert obs.startswith("xxxx") and obs.endswith("xxxx")


def test_truncate_text_formula():
    text = "a" * 300 + "b" * 700
    out = truncate_text(text, 200)
    assert len(out) <= 200 and out.startswith("aaa") and out.endswith("bbb")
    n = int(out.split("[truncated ")[1].split(" ")[0])
    kept = len(out) - len(f"\n...[truncated {n} characters]...\n")
    assert kept + n == len(text)
    assert truncate_text("short", 200) == "short"


def test_raising_hanging_blocking_and_bad_tools_yield_observations(server):
    t0 = time.monotonic()
    status, out = post(
        server,
        {
            "trajectory_ids": ["r", "h", "b", "bad", "ok"],
            "actions": ["<raise/>", "<hang/>", "<sync>sleep", "<bad/>", "<echo>fine"],
        },
    )
    elapsed = time.monotonic() - t0
    assert status == 200
    o = out["observations"]
    assert (
        "RuntimeError: boom from the tool" in o[0]["obs"] and o[0]["invalid_reason"] == "tool_error"
    )
    assert "timed out after 1.5 s" in o[1]["obs"] and o[1]["invalid_reason"] == "timeout"
    assert "timed out" in o[2]["obs"]
    assert "expected (observation, done, valid)" in o[3]["obs"]
    assert o[4]["obs"] == "ok|<echo>fine"
    assert out["valids"] == [False, False, False, False, True]
    assert elapsed < 5, elapsed  # the hung calls ran concurrently
    assert get_json(server + "/health")["status"] == "ok"


def test_hung_call_does_not_block_other_requests(server):
    import threading

    res = {}
    th = threading.Thread(target=lambda: res.setdefault("h", one(server, "hh", "<hang/>")))
    th.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    assert one(server, "quick", "<echo>q")[0]["obs"] == "quick|<echo>q"
    assert time.monotonic() - t0 < 0.5
    th.join()
    assert "timed out" in res["h"][0]["obs"]


@pytest.mark.parametrize(
    "body,field,status",
    [
        ({"actions": ["a"]}, "trajectory_ids", 422),
        ({"trajectory_ids": ["a"]}, "actions", 422),
        ({"trajectory_ids": ["a", "b"], "actions": ["a"]}, "actions", 422),
        ({"trajectory_ids": "a", "actions": ["a"]}, "trajectory_ids", 422),
        ({"trajectory_ids": [["x"]], "actions": ["a"]}, "trajectory_ids", 422),
        ({"trajectory_ids": ["a"], "actions": [3]}, "actions", 422),
        ({"trajectory_ids": ["a"], "actions": ["a"], "extra_fields": [1]}, "extra_fields", 422),
        ({"trajectory_ids": ["a"], "actions": ["a"], "extra_fields": []}, "extra_fields", 422),
        (
            {
                "trajectory_ids": ["a"],
                "actions": ["a"],
                "extra_fields": [{RESUMED_FIELD: {"tool_calls": 2, "actions": ["x"]}}],
            },
            "extra_fields",
            422,
        ),
        ({"trajectory_ids": ["a"], "actions": ["a"], "finish": ["yes"]}, "finish", 422),
        (
            {"trajectory_ids": ["a"], "actions": ["a"], "is_last_step": [True, False]},
            "is_last_step",
            422,
        ),
    ],
)
def test_malformed_requests_get_4xx_naming_the_field(server, body, field, status):
    code, out = post(server, body)
    assert code == status
    assert out["field"] == field and field in out["error"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", "\xff".encode("latin-1")])
def test_bad_json_gets_400_and_server_survives(server, raw):
    code, out = post(server, raw)
    assert code == 400 and out["error"]
    assert get_json(server + "/health")["status"] == "ok"


def test_empty_request_is_422_and_int_ids(server):
    with pytest.raises(ProtocolError, match="trajectory_ids' is empty") as e:
        parse_request({"trajectory_ids": [], "actions": []})
    assert e.value.status == 422 and e.value.field == "trajectory_ids"
    code, out = post(server, {"trajectory_ids": [], "actions": []})
    assert code == 422 and out["field"] == "trajectory_ids"
    req = parse_request({"trajectory_ids": [7], "actions": ["x"], "finish": [1]})
    assert req.trajectory_ids == ["7"] and req.finish == [True] and req.extra_fields == [{}]
    with pytest.raises(ProtocolError, match="finish"):
        parse_request({"trajectory_ids": [7], "actions": ["x"], "finish": [None]})


def test_unknown_tool_name_fails_at_startup_with_the_list():
    with pytest.raises(RuntimeError, match="unknown tool"):
        with run_server(["no_such_tool"], startup_timeout=30):
            pass


def test_finish_tool_claims_no_action_only_the_finish_flag_ends(tmp_path):
    """An action no tool parses is invalid (never a silent finish), with or without the
    finish tool; the finish flag ends the trajectory and frees its state everywhere."""
    tool_dir = write_faulty_tool(str(tmp_path))
    with run_server(["faulty", "finish"], tool_dir=[tool_dir]) as url:
        assert one(url, "fin", "<count/>")[0] == "count=1"
        obs, done, valid = one(url, "fin", "The answer is 42.")
        assert (obs["obs"], done, valid) == ("", False, False)
        assert "no tool accepted" in obs["invalid_reason"]
        assert one(url, "fin", "<count/>")[0] == "count=2"  # state kept
        assert one(url, "fin", "The answer is 42.", finish=True) == ("", True, True)
        assert one(url, "fin", "<count/>")[0] == "count=1"  # freed everywhere


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--tools", "sql", "--workers", "0"], "--workers must be positive"),
        (["--tools", "sql", "--tool-dir", "/no/such/dir"], "does not exist (--tool-dir)"),
        (["--tools", "python_code", "--tool-opt", "python_memory_mb=lots"], "python_memory_mb"),
        (["--tools", "sql", "--tool-opt", "novalue"], "KEY=VALUE"),
    ],
)
def test_bad_command_line_exits_with_a_clear_message(flags, message):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "tool_server", "--port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
