"""Our agent loop in a native tool-call format (``rollout.tool_format``; rollout/native.py),
with a scripted sampler and a real tool server: the trajectory is the chat template's
rendering of the conversation (the gateway's, token for token), the loss mask covers only
sampled tokens, parallel and malformed calls, limits, and the config's errors."""

import asyncio
import dataclasses

import pytest
from support.scripted_sampler import ScriptedSampler

from tool_server.client import ToolClient
from tool_server.tools.python_code import PythonCodeTool
from verltool_jax.chat.render import ToolChat
from verltool_jax.gateway import Gateway, GatewayConfig
from verltool_jax.rollout.agent_loop import PromptItem, item_builder, make_formatter, run_rollout
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.inflight import Slot, snapshot
from verltool_jax.rollout.sync_baseline import run_rollout_sync

TOOLS = (PythonCodeTool().function_schema(),)
MESSAGES = [
    {"role": "system", "content": "Call python_code to compute."},
    {"role": "user", "content": "What is 6 * 7?"},
]


def call(code: str) -> str:
    return (
        '<tool_call>\n{"name": "python_code", "arguments": {"code": "' + code + '"}}\n</tool_call>'
    )


def native_cfg(**kw) -> RolloutConfig:
    kw.setdefault("max_turns", 3)
    kw.setdefault("max_response_tokens", 512)
    return RolloutConfig(tool_format="hermes", tools=TOOLS, **kw)


def item(tok, cfg, gid="p0") -> PromptItem:
    ids = cfg.tool_chat().render(tok, MESSAGES)[1]
    return PromptItem(ids, {"prompt": MESSAGES}, group_id=gid)


def rollout(tok, url, script, cfg, n_samples=1, canonical=True, sync=False):
    sampler = ScriptedSampler(tok, lambda rid, k: script[k], canonical=canonical)

    async def go():
        async with ToolClient(url) as c:
            if sync:
                return await run_rollout_sync([item(tok, cfg)], n_samples, sampler, c, tok, cfg)
            return await run_rollout([item(tok, cfg)], n_samples, sampler, c, tok, cfg)

    ((t, *rest),) = asyncio.run(go())
    t.check()
    return t, sampler


def test_a_native_trajectory_is_the_templates_rendering_of_the_conversation(tok, tool_url):
    script = {0: "Let me compute. " + call("print(6*7)"), 1: "<answer>42</answer>"}
    cfg = native_cfg()
    t, sampler = rollout(tok, tool_url, script, cfg)
    assert (t.termination, t.num_turns, t.tool_calls, t.invalid_tool_calls) == ("eos", 2, 1, 0)
    assert t.observations == ["42\n"] and t.actions == ["<python>print(6*7)</python>"]
    chat = ToolChat(TOOLS, "hermes")
    text1, ids1 = chat.render(tok, MESSAGES)
    assert "<tool_call>" in text1 and '"python_code"' in text1  # the tool block, Hermes style
    conv = MESSAGES + [
        {"role": "assistant", "content": script[0]},
        {"role": "tool", "content": "42\n"},
    ]
    text2, ids2 = chat.render(tok, conv)
    final = tok.encode(script[1], add_special_tokens=False) + [tok.eos_token_id]
    # prompt with tools, the call, the template's tool turn and generation prompt, answer
    assert t.prompt_ids == ids1
    assert t.prompt_ids + t.response_ids == ids2 + final
    assert tok.decode(t.prompt_ids + t.response_ids) == text2 + script[1] + "<|im_end|>"
    # the turn stopped at the parser's stop string; the template's <|im_end|> is not sampled
    assert sampler.calls[0][2].stop == ("</tool_call>",)
    n0 = len(tok.encode(script[0], add_special_tokens=False))
    n_obs = len(ids2) - len(ids1) - n0
    assert tok.decode(t.response_ids[n0 : n0 + n_obs]).startswith("<|im_end|>\n<|im_start|>tool")
    assert t.loss_mask == [1] * n0 + [0] * n_obs + [1] * len(final)
    assert t.versions == [0] * n0 + [-1] * n_obs + [0] * len(final)
    assert t.logprobs[n0 : n0 + n_obs] == [0.0] * n_obs
    assert sampler.calls[1][1] == ids2  # the second request is what the gateway would send


def gateway_episode(tok, script, observations, canonical=True):
    """The same scripted model through the gateway, with a program that answers each call
    with the next of ``observations``: the episode's trajectory."""

    async def go():
        sampler = ScriptedSampler(tok, lambda rid, k: script[k], canonical=canonical)
        gw = Gateway(sampler, tok, GatewayConfig(tool_format="hermes"))
        key = gw.open_episode("g", {})
        msgs, obs = [dict(m) for m in MESSAGES], iter(observations)
        while True:
            out, _ = await gw.chat(key, {"messages": msgs, "tools": list(TOOLS)})
            reply = {k: v for k, v in out["choices"][0]["message"].items() if v is not None}
            msgs.append(reply)
            if not reply.get("tool_calls"):
                break
            for c in reply["tool_calls"]:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": next(obs)})
        (traj,) = gw.end(key)
        return traj

    return asyncio.run(go())


@pytest.mark.parametrize("canonical", [True, False])
def test_the_loop_records_what_the_gateway_records_parallel_calls_too(tok, tool_url, canonical):
    """Turns to the end-of-turn token (``stop_after_call=False``): two calls in one reply
    run in order and are answered in one tool turn; the trajectory equals the gateway's
    for the same program, also when the sampled ids are not the canonical tokenisation
    (the new text is spliced on, the sampled ids are kept)."""
    script = {
        0: call("print(6*7)") + "\n" + call("print(2+3)"),
        1: call("print(1)"),
        2: "<answer>42</answer>",
    }
    cfg = native_cfg(stop_after_call=False)
    t, sampler = rollout(tok, tool_url, script, cfg, canonical=canonical)
    assert (t.termination, t.num_turns, t.tool_calls, t.invalid_tool_calls) == ("eos", 3, 3, 0)
    assert t.observations == ["42\n", "5\n", "1\n"]
    assert t.actions == [f"<python>{c}</python>" for c in ("print(6*7)", "print(2+3)", "print(1)")]
    assert sampler.calls[0][2].stop == ()
    g = gateway_episode(tok, script, t.observations, canonical)
    assert g.prompt_ids == t.prompt_ids
    assert g.response_ids == t.response_ids
    assert g.loss_mask == t.loss_mask


def test_a_malformed_call_is_an_invalid_call_observation(tok, tool_url):
    bad_json = '<tool_call>{"name": "python_code", "arguments": {"code": "print(1)"</tool_call>'
    unknown = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    no_arg = '<tool_call>{"name": "python_code", "arguments": {"src": "print(1)"}}</tool_call>'
    script = {0: bad_json, 1: unknown, 2: no_arg, 3: "<answer>?</answer>"}
    cfg = native_cfg(max_turns=5)
    t, _ = rollout(tok, tool_url, script, cfg)
    assert (t.termination, t.num_turns, t.tool_calls, t.invalid_tool_calls) == ("eos", 4, 3, 3)
    assert t.tool_latencies == []  # answered here: the tool server was never called
    assert "invalid JSON" in t.observations[0]
    assert "unknown tool 'python'" in t.observations[1] and "python_code" in t.observations[1]
    assert "'code'" in t.observations[2]
    assert all(o.startswith("Error: ") for o in t.observations)
    masked = tok.decode([i for i, m in zip(t.response_ids, t.loss_mask) if m == 0])
    assert all(o in masked for o in t.observations)  # each error is in a tool turn (mask 0)
    sampled = tok.decode([i for i, m in zip(t.response_ids, t.loss_mask) if m == 1])
    assert sampled == bad_json + unknown + no_arg + "<answer>?</answer><|im_end|>"


def test_limits_turns_budget_and_truncation(tok, tool_url):
    loop = {k: call(f"print({k})") for k in range(5)}
    t, _ = rollout(tok, tool_url, loop, native_cfg(max_turns=2))
    assert (t.termination, t.tool_calls, t.num_turns) == ("max_turns", 2, 3)
    # a reply with more parallel calls than are left: the rest answered, not run
    two = {0: call("print(1)") + call("print(2)"), 1: "<answer>1</answer>"}
    t, _ = rollout(tok, tool_url, two, native_cfg(max_turns=1, stop_after_call=False))
    assert (t.termination, t.tool_calls, t.invalid_tool_calls) == ("eos", 1, 0)
    assert "not run" in tok.decode(t.response_ids)
    t, _ = rollout(tok, tool_url, loop, native_cfg(max_turns=10, max_response_tokens=80))
    assert t.termination == "budget" and len(t.response_ids) <= 80
    long = {0: call("print('ab ' * 500)"), 1: "<answer>x</answer>"}
    t, _ = rollout(tok, tool_url, long, native_cfg(max_obs_tokens=12, obs_truncate_marker="[cut]"))
    assert t.obs_truncated == 1 and "[cut]" in tok.decode(t.response_ids)
    assert len(tok.decode(t.response_ids)) < 200


def test_llama3_calls_and_the_sync_baseline(tok, tool_url):
    """Llama-3 JSON calls (no stop string: the reply is the call); the batch-synchronous
    baseline gives the same records as the asynchronous loop."""
    two = '{"name": "python_code", "parameters": {"code": "print(3)"}}; ' + (
        '{"name": "python_code", "parameters": {"code": "print(4)"}}'
    )
    script = {0: two, 1: "<answer>7</answer>"}
    cfg = RolloutConfig(tool_format="llama3", tools=TOOLS, max_turns=3, max_response_tokens=512)
    assert cfg.sampling_params(8).stop == ()
    a, _ = rollout(tok, tool_url, script, cfg)
    assert (a.termination, a.tool_calls, a.observations) == ("eos", 2, ["3\n", "4\n"])
    s, _ = rollout(tok, tool_url, script, cfg, sync=True)
    assert (s.response_ids, s.loss_mask, s.observations) == (
        a.response_ids,
        a.loss_mask,
        a.observations,
    )


def test_a_native_group_in_flight_is_rolled_out_again_after_a_resume(tok, tool_url):
    """A checkpoint keeps no native conversation: a group with a trajectory not yet ended
    is left out of the snapshot (the ledger rolls its prompt out again)."""
    cfg = native_cfg()
    slot = Slot(item_builder(item(tok, cfg), "p0-0", cfg, tok, make_formatter(tok, cfg)))
    entries = {"p0": type("E", (), {"serial": 1, "base_gid": "p0", "attempt": 0})()}
    assert snapshot({"p0": [slot]}, [], entries) == []
    slot.builder.traj.termination = "eos"  # ended: its record is all there is
    assert [r["gid"] for r in snapshot({"p0": [slot]}, [], entries)] == ["p0"]


def test_config_errors_name_the_field_and_the_fix(tok):
    with pytest.raises(ValueError, match=r"rollout.tool_format='xml' must be one of \['tags'"):
        RolloutConfig(tool_format="xml")
    with pytest.raises(ValueError, match="rollout.tool_prompt"):
        RolloutConfig(tool_format="hermes", tool_prompt="long")
    with pytest.raises(ValueError, match="close_action_on_length=None"):
        RolloutConfig(tool_format="hermes", close_action_on_length="</python>")
    with pytest.raises(ValueError, match="remove it from rollout.final_stop_strings"):
        RolloutConfig(tool_format="qwen3", final_stop_strings=("</tool_call>",))
    RolloutConfig(tool_format="hermes", stop_after_call=False, final_stop_strings=("</x>",))
    with pytest.raises(ValueError, match="needs the tools' schemas"):
        RolloutConfig(tool_format="hermes").tool_chat()
    assert RolloutConfig().tool_chat() is None and RolloutConfig().tool_format == "tags"
    # a prompt that is not the rendering with the tools is refused, not trained on
    cfg = native_cfg()
    bad = PromptItem(tok.encode("hi", add_special_tokens=False), {"prompt": MESSAGES}, "p0")
    with pytest.raises(ValueError, match="prompt_ids are not the chat template's rendering"):
        item_builder(bad, "p0-0", cfg, tok, make_formatter(tok, cfg))
    with pytest.raises(ValueError, match="'prompt' messages"):
        item_builder(
            PromptItem(bad.prompt_ids, {}, "p0"), "p0-0", cfg, tok, make_formatter(tok, cfg)
        )


def test_the_run_reads_the_tools_from_its_tool_server(tok, tool_url):
    """``train.build.with_tool_schemas``: the schemas come from the tool server
    (``GET /tools``); the prompt pipeline renders prompts with them; a template that
    rewrites earlier turns is refused; so is the native format through the gateway."""
    import copy

    from tool_server.client import ToolServerError, fetch_tool_schemas
    from verltool_jax.cli import load_config
    from verltool_jax.data.pipeline import PromptPipeline
    from verltool_jax.run_config import ConfigError, RunConfig, run_config_from_dict
    from verltool_jax.train.build import with_tool_schemas

    schemas = fetch_tool_schemas(tool_url)
    assert [s["function"]["name"] for s in schemas] == ["python_code", "sleep_search", "sql"]
    assert schemas[0] == PythonCodeTool().function_schema()
    with pytest.raises(ToolServerError, match="cannot read the tool schemas"):
        fetch_tool_schemas("http://127.0.0.1:9", timeout_s=1)
    tags = RunConfig()
    assert with_tool_schemas(tags, tool_url, tok) is tags
    rc = dataclasses.replace(tags, rollout=dataclasses.replace(tags.rollout, tool_format="hermes"))
    rc = with_tool_schemas(rc, tool_url, tok)
    assert rc.rollout.tools == tuple(schemas)
    chat = rc.rollout.rollout_config().tool_chat()
    (ex,) = PromptPipeline([{"prompt": MESSAGES}], tok, shuffle=False, num_epochs=1, chat=chat)
    assert ex.prompt_ids == chat.render(tok, MESSAGES)[1]
    assert '"sleep_search"' in tok.decode(ex.prompt_ids)
    forgetful = copy.deepcopy(tok)  # renders only the last message: rewrites history
    forgetful.chat_template = (
        "{% for m in messages[-1:] %}{{ m['role'] + ': ' + m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(ValueError, match="rollout.producer='gateway'"):
        with_tool_schemas(rc, tool_url, forgetful)
    c = load_config("configs/tiny_math.py:gateway")
    c.rollout.tool_format = "hermes"
    with pytest.raises(ConfigError, match="rollout.tool_format='hermes' is our agent loop's"):
        run_config_from_dict(c)
    with pytest.raises(ValueError, match="choose one"):
        load_config("configs/tiny_math.py:gateway,native")
