"""``--compat verltool``: VerlTool's clients get VerlTool's answers from this server.

Requests are sent in the shapes VerlTool's agent loop sends
(``verl_tool/agent_loop/verltool_agent_loop.py``, ``interact_with_tool_server``:
``trajectory_ids``, ``actions``, ``finish: [not do_action]``, ``is_last_step``,
``extra_fields: [extra_info]``). The expected observations are written from VerlTool's
server and tools (TIGER-AI-Lab/verl-tool): ``verl_tool/servers/tool_server.py``
(routing, invalid action, finish), ``verl_tool/servers/tools/python_code.py``,
``verl_tool/servers/tools/sql.py`` with ``tools/utils/sql_executor.py``, and
``verl_tool/servers/tools/search_retrieval.py``; each test names the part it follows.
The native format is checked alongside (our trainer keeps it).
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys

import pytest
from support.retrieval import synthetic_index
from support.tool_server import one

from tool_server.dispatcher import Dispatcher
from tool_server.kit import python_compat as _python_compat
from tool_server.kit import search_compat as _search_compat
from tool_server.kit.base import ToolSettings
from tool_server.kit.compat import verltool_usage_block
from tool_server.launcher import post_json, run_server
from tool_server.protocol import parse_request
from tool_server.tools.finish import FinishTool
from tool_server.tools.search_retrieval import SearchRetrievalTool
from tool_server.tools.sql import SqlTool

# tool_server.py, AsyncToolManager.get_usage_instructions: "Available tools:" then
# "• {tool_type}: {get_usage_inst()}" for every tool but finish, in --tool_type order.
USAGE = (
    "Available tools:\n"
    "• python_code: You are able to write and execute Python code securely inside a "
    "Firejail sandbox.\n"
    "• sql: You can execute SQL queries using <sql>...</sql> tags for intermediate "
    "verification or <solution>...</solution> tags for final answers.\n"
    "• search_retrieval: You can search for information by putting your query between "
    "<search> and </search> tags."
)
# tool_server.py, _handle_invalid_actions (done_if_invalid defaults to False)
INVALID = {"obs": "", "invalid_reason": "No valid tool found for action", "available_tools": USAGE}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("compat_db") / "shop.db"
    with sqlite3.connect(path) as c:
        c.execute("create table t(x integer, name text)")
        c.executemany("insert into t values (?, ?)", [(1, "a"), (2, "b")])
        c.execute("create table big(s text)")
        c.executemany(
            "insert into big values (?)", [(f"row{i:05d}-" + "z" * 20,) for i in range(600)]
        )
    return str(path)


@pytest.fixture(scope="module")
def server():
    with run_server(
        ["python_code", "sql", "search_retrieval", "finish"],
        compat="verltool",
        timeout=4,
        workers=1,
        max_obs_length=500,
        tool_opt={"python_timeout": "2", "retrieval_index": synthetic_index("bm25"), "topk": "2"},
    ) as url:
        yield url


def vt_call(url, tid, action, do_action=True, is_last_step=False, extra=None):
    """One request exactly as VerlTool's agent loop builds it."""
    body = {
        "trajectory_ids": [tid],
        "actions": [action],
        "finish": [not do_action],
        "is_last_step": [is_last_step],
    }
    if extra is not None:
        body["extra_fields"] = [extra]
    status, out = post_json(url + "/get_observation", body)
    assert status == 200, out
    return out["observations"][0], out["dones"][0], out["valids"][0]


# ------------------------------------------------------------ server: routing, finish
def test_unparsed_action_is_invalid_not_a_finish(server):
    # tool_server.py: finish is skipped when routing; no tool -> invalid, done=False
    assert vt_call(server, "r1", "The answer is 42.") == (INVALID, False, False)
    assert vt_call(server, "r1", "<solution>SELECT 1</solution>") == (INVALID, False, False)
    assert vt_call(server, "r1", "<sql>SELECT 1</sql> then <sql>unclosed") == (
        INVALID,
        False,
        False,
    )


def test_finish_flag_and_extra_field_finish_end_the_trajectory(server):
    # FinishTool.conduct_action: ("", True, True), chosen only by finish=True (the request
    # list is merged into extra_fields, which _identify_tool_for_action reads)
    assert vt_call(server, "f1", "", do_action=False, is_last_step=True) == ("", True, True)
    assert vt_call(server, "f2", "The answer is 42.", extra={"finish": True}) == ("", True, True)


def test_empty_trajectory_ids_is_422(server):
    # ActionRequest: trajectory_ids and actions have min_length=1 (pydantic -> 422)
    status, _ = post_json(server + "/get_observation", {"trajectory_ids": [], "actions": []})
    assert status == 422


def test_usage_block_and_only_finish_server():
    assert verltool_usage_block([FinishTool()]) == "No tools available for usage instructions."
    settings = ToolSettings(compat="verltool")
    d = Dispatcher([FinishTool(settings)], settings)  # VerlTool: a single tool gets every action
    out = asyncio.run(d.handle(parse_request({"trajectory_ids": ["a"], "actions": ["x"]})))
    assert out == {"observations": [""], "dones": [True], "valids": [True]}
    native = Dispatcher([FinishTool()], ToolSettings())
    out = asyncio.run(native.handle(parse_request({"trajectory_ids": ["a"], "actions": ["x"]})))
    assert (out["dones"], out["valids"]) == ([False], [False])


# ------------------------------------------------------------ python_code
CARETS = sys.version_info >= (3, 11)


@pytest.mark.parametrize(
    "action,extra,want",
    [
        # PRE_IMPORT_LIBS: "from math import *" ... -> sqrt, gcd; postprocess_observation:
        # "</python>" in the action -> "\n<result>\n{obs}\n</result>\n"
        ("<python>print(sqrt(16), gcd(12, 18))</python>", None, "\n<result>\n4.0 6\n</result>\n"),
        # ```python and an even number of ``` -> "\n```result\n{obs}\n```\n"; the user code is
        # on line 82 of main.py (PRE_IMPORT_LIBS + wrap_code_blocks); clean_traceback -> "main.py"
        (
            "```python\nprint(1/0)\n```",
            None,
            '\n```result\nTraceback (most recent call last):\n  File "main.py", line 82, in <module>\n'
            "    print(1/0)\n"
            + ("          ~^~\n" if CARETS else "")
            + "ZeroDivisionError: division by zero\n```\n",
        ),
        # odd number of ``` (an open ```output block) -> "\n{obs}\n```\n"
        ("```python\nprint(2)\n```\n```output", None, "\n2\n```\n"),
        # </tool_call> -> <tool_response> block
        (
            "<tool_call><python>print(3)</python></tool_call>",
            None,
            "\n<tool_response>\n```result\n3\n```\n</tool_response>\n",
        ),
        # the action ends with <result> -> "\n{obs}\n</result>\n"
        ("<python>print(4)</python>\n<result>", None, "\n4\n</result>\n"),
        # stdout + "\n" + stderr, stripped of spaces and newlines
        (
            "<python>import sys\nprint('out')\nprint('err', file=sys.stderr)</python>",
            None,
            "\n<result>\nout\n\nerr\n</result>\n",
        ),
        # extra_field["stdin"] is the program's stdin ...
        (
            "<python>a, b = map(int, input().split())\nprint(a + b)</python>",
            {"stdin": "5 7"},
            "\n<result>\n12\n</result>\n",
        ),
        # ... unless the action has a ```input block (its first one, stripped)
        (
            "<python>print(input())</python>\n```input\nfrom-block\n```",
            {"stdin": "x"},
            "\n<result>\nfrom-block\n</result>\n",
        ),
        # check_forbidden_imports -> stderr "Execution blocked: ..."
        (
            "<python>import subprocess\nprint(1)</python>",
            None,
            "\n<result>\nExecution blocked: Code contains potentially dangerous operations or "
            "imports.\n</result>\n",
        ),
        # all <python> blocks, stripped, joined by newlines; an empty program prints nothing
        (
            "<python>x = 6</python> and <python>  print(x * 7)</python>",
            None,
            "\n<result>\n42\n</result>\n",
        ),
        ("<python></python>", None, "\n<result>\n\n</result>\n"),
    ],
)
def test_python_code_observations(server, action, extra, want):
    assert vt_call(server, "py", action, extra=extra) == (want, False, True)


def test_python_timeout_and_no_server_truncation(server):
    # TimeoutExpired: partial stdout, stderr += "Execution timed out after {timeout} seconds.\n"
    obs, done, valid = vt_call(
        server, "pt", "<python>import time\nprint('a', flush=True)\ntime.sleep(30)</python>"
    )
    assert (obs, done, valid) == (
        "\n<result>\na\n\nExecution timed out after 2 seconds.\n</result>\n",
        False,
        True,
    )
    # VerlTool's server does not cut observations (--max-obs-length 500 here)
    obs, _, _ = vt_call(server, "pl", "<python>print('y' * 3000)</python>")
    assert obs == "\n<result>\n" + "y" * 3000 + "\n</result>\n"


def test_python_prelude_line_count():
    lines = _python_compat.program("USER").split("\n")
    assert lines.index("USER") + 1 == _python_compat.USER_CODE_LINE == 82
    assert lines[0] == "from string import *" and "from math import *" in lines


# ------------------------------------------------------------ sql
def sql_obs(text, turns_left=0, parsed=""):
    # sql.py conduct_action: {"obs": "\n\n<observation>{observation}\n{reminder}
    # </observation>\n\n", "parsed_sql": parsed_action}
    return {
        "obs": f"\n\n<observation>{text}\n<reminder>You have {turns_left} turns left to "
        "complete the task.</reminder></observation>\n\n",
        "parsed_sql": parsed,
    }


@pytest.mark.parametrize(
    "action,want_text",
    [
        # sql_observation: pandas.DataFrame(rows).to_string(index=False)
        ("<sql>SELECT x, name FROM t ORDER BY x</sql>", " 0 1\n 1 a\n 2 b"),
        # extract_sql_from_markdown: the ```sql block inside; "> =" -> ">="
        ("<sql>```sql\nSELECT x FROM t WHERE x > = 2\n```</sql>", " 0\n 2"),
        # replace_current_year
        ("<sql>SELECT YEAR(CURDATE())</sql>", "   0\n2020"),
        # no rows: an empty DataFrame
        ("<sql>SELECT x FROM t WHERE x > 5</sql>", "Empty DataFrame\nColumns: []\nIndex: []"),
        # execute_query: "Error executing SQL: {e}"
        ("<sql>SELECT nope FROM t</sql>", "Error executing SQL: no such column: nope"),
        ("<sql>DELETE FROM t</sql>", "Error executing SQL: attempt to write a readonly database"),
        # parse_action: the last <sql> and the next </sql>
        ("<sql>SELECT 1</sql> and <sql>SELECT 2</sql>", " 0\n 2"),
        # empty query
        (
            "<sql></sql>",
            "Your previous action is invalid. Follow the format of outputting "
            "thinking process and sql tool, and try again.",
        ),
    ],
)
def test_sql_observations(server, db, action, want_text):
    parsed = action[action.rfind("<sql>") + 5 : action.rfind("</sql>")].strip()
    obs, done, valid = vt_call(server, "s", action, extra={"db_path": db, "turns_left": 3})
    assert (obs, done, valid) == (sql_obs(want_text, 3, parsed), False, True)


def test_sql_long_result_missing_db_and_no_db(server, db):
    import pandas as pd

    rows = [(f"row{i:05d}-" + "z" * 20,) for i in range(600)]
    head = pd.DataFrame(rows).head(50).to_string(index=False)
    obs, _, valid = vt_call(server, "s", "<sql>SELECT s FROM big</sql>", extra={"db_path": db})
    assert (
        obs
        == sql_obs(
            "Truncated to 50 lines since returned response too long: " + head,
            0,
            "SELECT s FROM big",
        )
        and valid
    )
    assert head.split("\n")[1] == "row00000-" + "z" * 20
    obs, _, valid = vt_call(server, "s", "<sql>SELECT 1</sql>", extra={"db_path": db + ".nope"})
    assert obs == sql_obs(f"The database file {db}.nope does not exist.", 0, "SELECT 1") and valid
    # neither db_path nor db_id: KeyError('db_id') -> "Execution Error:\n'db_id'", invalid
    assert vt_call(server, "s", "<sql>SELECT 1</sql>", extra={}) == (
        sql_obs("Execution Error:\n'db_id'", 0, "SELECT 1"),
        False,
        False,
    )


def test_sql_per_tool_override_and_db_root(db, tmp_path):
    native = SqlTool(ToolSettings(compat="verltool", extra={"sql_compat": "native"}))
    obs, done, valid = native.conduct_action("t", "SELECT x FROM t ORDER BY x", {"db_path": db})
    assert obs.startswith("x\n-\n1\n2") and (done, valid) == (False, True)
    rooted = SqlTool(ToolSettings(compat="verltool", extra={"sql_db_root": str(tmp_path)}))
    obs, _, valid = rooted.conduct_action("t", "SELECT 1", {"db_path": db})
    assert obs == sql_obs(f"Error: database {db!r} is outside the allowed root.", 0, "SELECT 1")
    obs, _, _ = rooted.conduct_action("t", "SELECT 1", {"db_path": "/no/such.db"})
    assert "outside the allowed root" in obs["obs"]  # nothing told about other paths


# ------------------------------------------------------------ search_retrieval
def test_search_observations(server):
    # search_retrieval.py: f'\n\n<information>{passages.strip()}</information>\n\n' with
    # "Doc {i}(Title: {first line}) {other lines}\n" per document (Search-R1 format)
    obs, done, valid = vt_call(server, "q", "<search>magnetic needle north market</search>")
    assert obs == (
        "\n\n<information>Doc 1(Title: Compass) A magnetic compass has a needle "
        "that aligns with the Earth's magnetic field and points north, helping "
        "travellers find their direction.\nDoc 2(Title: Varholt) Varholt is a "
        "market town on the river Morabre, founded in the year 1100. It is famous "
        "for its copper kettles and holds a fair every spring.</information>\n\n"
    )
    assert (done, valid) == (False, True)
    # no hits: an empty block
    assert vt_call(server, "q", "<search>xylophone quasar</search>") == (
        "\n\n<information></information>\n\n",
        False,
        True,
    )
    # an <answer> (without </search>) ends the trajectory, valid=False
    assert vt_call(server, "q", "So <answer>Paris</answer>") == ("", True, False)


def test_search_format_and_parse_units():
    f = _search_compat.format_information
    assert (
        f([("T", "line1\nline2")])
        == "\n\n<information>Doc 1(Title: T) line1\nline2</information>\n\n"
    )
    assert f([("", "")]) == "\n\n<information>Doc 1(Title: No title) No content</information>\n\n"
    assert f([("", "Only\nrest")]) == "\n\n<information>Doc 1(Title: Only) rest</information>\n\n"
    assert f([]) == "\n\n<information></information>\n\n"
    p = _search_compat.parse
    assert p("<search>a</search> <answer>b</answer>") == _search_compat.CompatAction("search", "a")
    assert p("<search></search>").text == ""
    assert p("<search>unclosed") is None and p("<answer>x") is None
    native = SearchRetrievalTool(ToolSettings())
    assert native.parse_action("<answer>42</answer>") == (None, False)
    vt = SearchRetrievalTool(ToolSettings(extra={"search_retrieval_compat": "verltool"}))
    assert vt.parse_action("<answer>42</answer>")[1] is True


def test_bad_compat_value_names_the_option():
    with pytest.raises(ValueError, match="search_retrieval_compat"):
        SearchRetrievalTool(ToolSettings(extra={"search_retrieval_compat": "verl"}))


# ------------------------------------------------------------ native format is unchanged
def test_native_python_reads_stdin_and_keeps_its_format():
    with run_server(["python_code", "finish"], timeout=4, workers=1) as url:
        obs, done, valid = one(
            url, "n", "<python>print(input()[::-1])</python>", extra_fields={"stdin": "abc"}
        )
        assert (obs, done, valid) == ("cba\n", False, True)
        assert one(url, "n", "<python>print(1)</python>") == ("1\n", False, True)
        obs, _, _ = one(
            url,
            "k",
            "<python>print(input() + '!')</python>",
            extra_fields={"stdin": "kernel", "stateful": True},
        )
        assert obs == "kernel!\n"  # the stateful interpreter too
        one(url, "k", "", finish=True)
        obs, done, valid = one(url, "n", "The answer is 42.")
        assert (obs["obs"], done, valid) == ("", False, False)
        assert "no tool accepted" in obs["invalid_reason"]
