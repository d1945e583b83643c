"""The tiny_math task generator: verl-layout parquet, held-out split, SFT demonstrations."""

from __future__ import annotations

import pytest
from support.tiny_data import tiny_tokenizer

from verltool_jax.cli import load_config
from verltool_jax.data import PromptPipeline, SFTPipeline, read_rows, validate_sft_row
from verltool_jax.run_config import run_config_from_dict
from verltool_jax.tasks import prepare_task, tiny_math


def test_generate_and_write(tmp_path):
    cfg = load_config("configs/tiny_math.py:smoke")
    files = prepare_task(run_config_from_dict(cfg), tmp_path / "data")
    train, evals = read_rows(files.train), read_rows(files.eval)
    sft = read_rows(files.sft, validate=validate_sft_row)
    assert (len(train), len(evals), len(sft)) == (
        cfg.task.num_train,
        cfg.task.num_eval,
        cfg.task.num_demos,
    )
    pairs = lambda rows: {(r["extra_info"]["a"], r["extra_info"]["b"]) for r in rows}
    assert not pairs(train) & pairs(evals)  # held out
    for r in train + evals:
        a, b = r["extra_info"]["a"], r["extra_info"]["b"]
        assert 1000 <= a <= 9999 and 1000 <= b <= 9999
        assert r["reward_model"]["ground_truth"] == str(a * b)
        assert r["data_source"] == "tiny_math"
        assert r["prompt"][-1]["content"] == f"What is {a} * {b}?"
    # Same seed -> same data; another seed -> other data.
    again = tiny_math.generate(cfg.task.num_train, cfg.task.num_eval, 0, seed=cfg.task.seed)
    assert [r["reward_model"] for r in again[0]] == [r["reward_model"] for r in train]
    other = tiny_math.generate(cfg.task.num_train, cfg.task.num_eval, 0, seed=cfg.task.seed + 1)
    assert [r["reward_model"] for r in other[0]] != [r["reward_model"] for r in train]


def test_demonstration_format_tokens(tmp_path):
    tok = tiny_tokenizer()
    files = tiny_math.write_task(tmp_path, num_train=4, num_eval=2, num_demos=2, seed=7)
    pipe = SFTPipeline.from_files([files.sft], tok, shuffle=False)
    ex = next(pipe)
    a, b = ex.row["extra_info"]["a"], ex.row["extra_info"]["b"]
    p = a * b
    assert tok.decode(ex.response_ids) == (
        f"<python>print({a} * {b})</python><result>\n{p}\n\n</result><answer>{p}</answer><|im_end|>"
    )
    toks = tok.convert_ids_to_tokens(ex.response_ids)
    for atomic in ("<python>", "</python>", "<result>", "</result>", "<answer>", "</answer>"):
        assert atomic in toks  # one token each
    trained = tok.decode([t for t, m in zip(ex.response_ids, ex.loss_mask) if m])
    assert trained == f"<python>print({a} * {b})</python><answer>{p}</answer><|im_end|>"
    prompts = PromptPipeline.from_files(
        [files.eval], tok, shuffle=False, num_epochs=1, max_prompt_tokens=96
    )
    assert len(prompts.next_batch(10)) == 2  # the prompt fits the config budget


def test_custom_obs_template_and_bad_sizes():
    segs = tiny_math.demonstration_segments(1234, 5678, obs_template="<result>{obs}</result>")
    assert segs[1] == {"text": "<result>7006652\n</result>", "loss": False}  # as the tool prints
    with pytest.raises(ValueError, match="num_demos=5 must be <= num_train=3"):
        tiny_math.generate(3, 1, 5)
    with pytest.raises(ValueError, match="cannot draw"):
        tiny_math.generate(100, 10, 0, digits=(1,))
    with pytest.raises(ValueError, match="obs_template"):
        tiny_math.demonstration_segments(1, 2, obs_template="no slot")
    cfg = load_config("configs/tiny_math.py:smoke")
    cfg.task.name = "tiny_mth"
    with pytest.raises(ValueError, match="task.name='tiny_mth' is not a known task"):
        prepare_task(run_config_from_dict(cfg), "/nonexistent")


@pytest.mark.parametrize("tool_prompt", ["hermes", "compact"])
def test_native_demonstrations_are_what_the_gateway_renders(tool_prompt):
    """``task.native_tools``: a demonstration's prompt is the gateway's rendering of the
    program's request (row messages + the python tool, in the run's tool block), its reply
    a python_code call, and prompt + reply + observation the gateway's rendering of the
    second call."""
    import json

    from tool_server.tools.python_code import PythonCodeTool
    from verltool_jax.chat.render import normalize_messages, render, template_of
    from verltool_jax.chat.tool_parsers import parse_tool_calls
    from verltool_jax.data.templating import prompt_token_ids

    tok = tiny_tokenizer()
    train, _, sft = tiny_math.generate(4, 2, 2, native_tools=True, tool_prompt=tool_prompt)
    demo, row = sft[0], train[0]
    assert row["prompt"][0]["content"] == tiny_math.NATIVE_SYSTEM_PROMPT
    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    tools = [PythonCodeTool().function_schema()]
    norm = normalize_messages(
        row["prompt"], tools, raw_replies={}, template=template_of(tok), fmt="hermes",
        tool_prompt=tool_prompt,
    )  # fmt: skip
    text1, ids1 = render(tok, norm, tools)
    assert prompt_token_ids(tok, demo["prompt"]) == ids1
    # the compact block is what makes the prompt short enough for the tiny model to learn
    assert len(ids1) < 130 if tool_prompt == "compact" else len(ids1) > 400
    reply, obs, answer = (s["text"] for s in demo["response_segments"])
    assert reply.endswith(tok.eos_token) and answer == f"<answer>{a * b}</answer>"
    (call,) = parse_tool_calls(reply.removesuffix(tok.eos_token), "hermes").calls
    assert call.name == "python_code"
    assert json.loads(call.arguments) == {"code": f"print({a} * {b})"}
    turn2 = norm + [
        {"role": "assistant", "content": reply.removesuffix(tok.eos_token)},
        {"role": "tool", "content": f"{a * b}\n"},
    ]
    assert render(tok, turn2, tools)[0] == text1 + reply + obs


def test_the_native_variant_writes_native_data_and_a_mismatch_is_refused(tmp_path):
    """``:native`` (our loop, ``rollout.tool_format="hermes"``) writes the prompts and
    demonstrations of ``:gateway``, in its own tool block (``rollout.tool_prompt``); a
    loop whose format does not match ``task.native_tools`` is refused before any work."""
    cfg = load_config("configs/tiny_math.py:smoke,native")
    files = prepare_task(run_config_from_dict(cfg), tmp_path / "data")
    (demo,) = read_rows(files.sft, validate=validate_sft_row)[:1]
    assert demo["prompt"][0]["content"].endswith(
        "Tools: python_code(code: string)\n"
        + ('Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>')
    )  # the compact block
    cfg.rollout.tool_format = "tags"
    with pytest.raises(ValueError, match="set rollout.tool_format='hermes' or task.native_tools"):
        prepare_task(run_config_from_dict(cfg), tmp_path / "other")
    cfg = load_config("configs/tiny_math.py:smoke")
    cfg.rollout.tool_format = "hermes"
    with pytest.raises(
        ValueError, match="set rollout.tool_format='tags' or task.native_tools=True"
    ):
        prepare_task(run_config_from_dict(cfg), tmp_path / "other")
