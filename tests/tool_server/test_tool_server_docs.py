"""docs/adding_a_tool.md is true: the tool file shown there, written to a temporary
folder, is discovered by a real server through --tool-dir and works as described."""

from __future__ import annotations

import os
import re

from support.tool_server import one

from tool_server.launcher import get_json, post_json, run_server

DOC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "docs",
    "adding_a_tool.md",
)


def doc_tool_source() -> str:
    text = open(DOC).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    return next(b for b in blocks if "class CalculatorTool" in b)


def test_tool_from_the_doc_added_from_a_temporary_file(tmp_path):
    (tmp_path / "calculator.py").write_text(doc_tool_source())
    with run_server(["calculator", "sql"], tool_dir=[str(tmp_path)]) as url:
        assert get_json(url + "/health")["tools"] == ["calculator", "sql"]
        usage = {t["name"]: t["usage"] for t in get_json(url + "/tools")["tools"]}
        assert "<calc>" in usage["calculator"]
        status, out = post_json(
            url + "/get_observation", {"trajectory_ids": ["t1"], "actions": ["<calc>6*7</calc>"]}
        )
        assert status == 200
        assert out == {
            "observations": [{"obs": "42", "metrics": {"calls": 1}}],
            "dones": [False],
            "valids": [True],
        }
        assert one(url, "t1", "<calc>1/0</calc>")[0] == "Error: division by zero"
        assert one(url, "t1", "<calc>1+1</calc>")[0]["metrics"] == {"calls": 3}
        assert one(url, "t1", "", finish=True)[1] is True
        assert one(url, "t1", "<calc>1+1</calc>")[0]["metrics"] == {"calls": 1}
        assert one(url, "t1", "<sql>select 1</sql>")[2] is True  # routed past calculator
