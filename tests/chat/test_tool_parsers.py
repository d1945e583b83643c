"""Native tool-call parsing per format (``verltool_jax/chat/tool_parsers.py``) and the
tools' JSON Schemas (``BaseTool.function_schema``)."""

from __future__ import annotations

import json
import random

import pytest

from verltool_jax.chat.tool_parsers import (
    FORMATS,
    format_calls_as_text,
    parse_tool_calls,
    parser_for_model,
)


def _calls(reply):
    return [(c.name, json.loads(c.arguments)) for c in reply.calls]


def test_hermes_parallel_calls_and_content():
    text = (
        "Let me run both.\n"
        '<tool_call>\n{"name": "python_code", "arguments": {"code": "print(1)"}}\n</tool_call>\n'
        '<tool_call>{"name": "sql", "arguments": {"query": "SELECT 1"}}</tool_call>'
    )
    r = parse_tool_calls(text, "hermes")
    assert _calls(r) == [("python_code", {"code": "print(1)"}), ("sql", {"query": "SELECT 1"})]
    assert r.content == "Let me run both." and r.errors == []
    assert len({c.id for c in r.calls}) == 2 and all(c.id.startswith("call_") for c in r.calls)


def test_qwen3_keeps_reasoning_out_of_the_calls():
    text = (
        '<think>\nmaybe <tool_call>{"name": "x"}</tool_call>\n</think>\n\n'
        '<tool_call>\n{"name": "python_code", "arguments": {"code": "2+2"}}\n</tool_call>'
    )
    r = parse_tool_calls(text, "qwen3")
    assert _calls(r) == [("python_code", {"code": "2+2"})]
    assert r.reasoning is not None and "maybe" in r.reasoning and r.content == ""


def test_llama3_json_calls_parallel_and_python_tag():
    one = '{"name": "python_code", "parameters": {"code": "print(2)"}}'
    two = one + '; {"name": "sql", "parameters": {"query": "SELECT 2"}}'
    assert _calls(parse_tool_calls(one, "llama3")) == [("python_code", {"code": "print(2)"})]
    assert [n for n, _ in _calls(parse_tool_calls("<|python_tag|>" + two, "llama3"))] == [
        "python_code",
        "sql",
    ]
    plain = parse_tool_calls("The answer is {x}.", "llama3")
    assert plain.calls == [] and plain.content == "The answer is {x}." and plain.errors == []


@pytest.mark.parametrize(
    ("text", "fmt", "message"),
    [
        ('<tool_call>{"name": "python_code", "arguments": {</tool_call>', "hermes", "invalid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "hermes", "no 'name'"),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "hermes", "must be an object"),
        ('<tool_call>{"name": "f", "arguments": {}}', "hermes", "without a closing"),
        ('<|python_tag|>{"name": "f", "parameters": {', "llama3", "invalid JSON"),
        ('<|python_tag|>{"name": "f", "parameters": "not json"}', "llama3", "not JSON"),
    ],
)
def test_malformed_call_is_an_error_message_not_a_call(text, fmt, message):
    r = parse_tool_calls(text, fmt)
    assert r.calls == [] and len(r.errors) == 1 and message in r.errors[0]


def test_a_good_call_survives_a_bad_neighbour():
    text = '<tool_call>{bad}</tool_call><tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    r = parse_tool_calls(text, "hermes")
    assert _calls(r) == [("f", {"a": 1})] and len(r.errors) == 1


def test_parsers_never_raise_on_garbage():
    rng = random.Random(0)
    alphabet = ['<tool_call>', '</tool_call>', '{', '}', '"name"', ':', '"f"', '"arguments"',
                '[', ']', ',', ';', '<|python_tag|>', '<think>', '</think>', 'x', ' ', '"', '\\']  # fmt: skip
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        for fmt in FORMATS:
            r = parse_tool_calls(text, fmt)
            for c in r.calls:
                assert isinstance(json.loads(c.arguments), dict)


def test_format_round_trip_and_model_families():
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    for fmt in FORMATS:
        assert _calls(parse_tool_calls(format_calls_as_text(calls, fmt), fmt)) == [("f", {"a": 1})]
    assert parser_for_model("Qwen/Qwen2.5-7B-Instruct") == "hermes"
    assert parser_for_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "hermes"
    assert parser_for_model("Qwen/Qwen3-8B") == "qwen3"
    assert parser_for_model("meta-llama/Llama-3.1-8B-Instruct") == "llama3"
    with pytest.raises(ValueError, match="not one of"):
        parse_tool_calls("x", "mistral")


def test_tool_schemas_and_native_call_to_action():
    from tool_server.tools.python_code import PythonCodeTool
    from tool_server.tools.sql import SqlTool

    py = PythonCodeTool()
    s = py.function_schema()
    assert s["function"]["name"] == "python_code"
    assert s["function"]["parameters"]["required"] == ["code"]
    assert py.action_from_call("python_code", {"code": "print(3)"}) == "<python>print(3)</python>"
    parsed, ok = py.parse_action(py.action_from_call("python_code", {"code": "print(3)"}))
    assert ok
    with pytest.raises(ValueError, match="'code'"):
        py.action_from_call("python_code", {"src": "x"})
    assert SqlTool.call_tag == "sql"
