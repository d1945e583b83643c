"""The gateway on localhost, driven by the official ``openai`` client: the tiny JAX model
for real sampling, the scripted sampler where a test needs an exact reply (tool calls)."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest

from verltool_jax.gateway import Gateway, GatewayConfig, GatewayThread
from verltool_jax.samplers.base import SamplingParams

MAX_LEN = 256
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python_code",
            "description": "Run Python code.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def jax_gw(sampler_flax_model, sampler_tokenizer):
    from verltool_jax.samplers.jax_sampler import JAXSampler

    s = JAXSampler(sampler_flax_model, sampler_tokenizer, max_model_len=MAX_LEN, max_batch_size=4)
    gt = GatewayThread(
        Gateway(s, sampler_tokenizer, GatewayConfig(max_model_len=MAX_LEN, default_max_tokens=8))
    )
    yield gt
    gt.close()
    s.close()


def _client(gt, key):
    return openai.OpenAI(base_url=gt.gateway.url(key), api_key="unused", max_retries=0)


def _sampled(t):
    return [i for i, m in zip(t.response_ids, t.loss_mask) if m]


def test_models_route(jax_gw):
    key = jax_gw.open_episode()
    assert [m.id for m in _client(jax_gw, key).models.list().data] == ["policy"]
    jax_gw.call(lambda: _end(jax_gw.gateway, key))


async def _end(gw, key):
    gw.abort(key, "test done")


def test_two_turns_recorded_ids_equal_the_samplers(jax_gw):
    """Two calls of one episode become one trajectory; its sampled tokens are what the JAX
    sampler gives for the same prompt (greedy, so a direct call reproduces them), the
    new prompt tokens between the turns are masked out, and the policy version is kept."""
    gt = jax_gw
    key = gt.open_episode("g", {"row": 7})
    c = _client(gt, key)
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    r1 = c.chat.completions.create(model="policy", messages=msgs, temperature=0, max_tokens=6)
    msgs += [
        r1.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "Sure?"},
    ]
    r2 = c.chat.completions.create(model="policy", messages=msgs, temperature=0, max_tokens=6)
    assert r1.usage.completion_tokens == 6 and r2.choices[0].finish_reason in ("stop", "length")
    out = httpx.post(gt.gateway.url(key)[:-3] + "/end", json={"reward": 0.5}).json()
    assert out == {"ended": True, "samples": 1}
    (t,) = gt.wait(key)
    t.check()
    assert t.reward == 0.5 and t.num_turns == 2 and t.data["row"] == 7 and t.group_id == "g"
    n1 = r1.usage.completion_tokens
    first = t.response_ids[:n1]
    assert t.loss_mask[:n1] == [1] * n1 and set(t.versions[:n1]) == {0}
    gap = t.loss_mask[n1:].index(1)
    assert (
        gap > 0
        and set(t.versions[n1 : n1 + gap]) == {-1}
        and set(t.logprobs[n1 : n1 + gap]) == {0.0}
    )
    sampler = gt.gateway.sampler
    p = SamplingParams(max_tokens=6, temperature=0)
    direct1 = gt.call(lambda: sampler.generate(t.prompt_ids, p))
    assert direct1.token_ids == first
    np.testing.assert_allclose(direct1.logprobs, t.logprobs[:n1], atol=1e-5)
    prompt2 = t.prompt_ids + t.response_ids[: n1 + gap]
    direct2 = gt.call(lambda: sampler.generate(prompt2, p))
    assert direct2.token_ids == t.response_ids[n1 + gap :] == _sampled(t)[n1:]
    assert r2.usage.prompt_tokens == len(prompt2)
    st = gt.gateway.stats
    assert st["turns_extend"] + st["turns_splice"] >= 1 and st["turns_break"] == 0


def test_streaming_matches_and_api_key_addressing(jax_gw):
    gt = jax_gw
    key = gt.open_episode()
    c = openai.OpenAI(base_url=gt.base_url + "/v1", api_key=key, max_retries=0)
    chunks = list(
        c.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=5,
            temperature=0,
            stream_options={"include_usage": True},
        )  # fmt: skip
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [
        ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason
    ]
    assert finish in (["stop"], ["length"]) and chunks[-1].usage.completion_tokens >= 1
    gt.call(lambda: _end(gt.gateway, key))
    key2 = gt.open_episode()
    r = _client(gt, key2).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
    )
    assert r.choices[0].message.content == text
    gt.call(lambda: _end(gt.gateway, key2))


def test_errors_have_openai_bodies(jax_gw):
    gt = jax_gw
    with pytest.raises(openai.AuthenticationError) as e:
        _client(gt, "nope").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}]
        )
    assert e.value.code == "invalid_api_key"
    key = gt.open_episode()
    c = _client(gt, key)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x " * 400}]
        )
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=10**6
        )
    assert e.value.code == "context_length_exceeded" and e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.role"):
        c.chat.completions.create(model="policy", messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], temperature=-1
        )
    raw = httpx.post(gt.gateway.url(key) + "/chat/completions", content=b"{not json")
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    # nothing was recorded, so ending the episode yields no trajectory (and fails it)
    assert httpx.post(gt.gateway.url(key)[:-3] + "/end").json() == {"ended": True, "samples": 0}
    with pytest.raises(RuntimeError, match="without any call"):
        gt.wait(key)
    assert httpx.post(gt.base_url + "/t/nope/end").status_code == 401


def test_an_episode_never_ended_times_out_and_is_not_trained_on(jax_gw):
    gt = jax_gw
    key = gt.open_episode()
    _client(gt, key).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    gw = gt.gateway

    async def sweep_later():
        import time

        return gw.sweep(time.monotonic() + gw.config.episode_timeout_s + 1)

    assert gt.call(sweep_later) == 1
    with pytest.raises(RuntimeError, match="timeout"):
        gt.wait(key)
    with pytest.raises(openai.AuthenticationError):
        _client(gt, key).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}]
        )
    assert gw.stats["timed_out"] == 1


def test_opening_over_http(jax_gw):
    out = httpx.post(
        jax_gw.base_url + "/episodes", json={"group_id": "g9", "data": {"a": 1}}
    ).json()
    assert out["base_url"] == jax_gw.gateway.url(out["key"])
    assert jax_gw.gateway.episodes[out["key"]].group_id == "g9"
    bad = httpx.post(jax_gw.base_url + "/episodes", json={"data": [1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "data"
    jax_gw.call(lambda: _end(jax_gw.gateway, out["key"]))


# ------------------------------------------------------------------ tool calls, scripted
REPLIES = {
    "hermes": 'I will run it.\n<tool_call>\n{"name": "python_code", "arguments": {"code": "print(6*7)"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "python_code", "arguments": {"code": "print(1)"}}\n</tool_call>',
    "qwen3": '<think>\nUse python.\n</think>\n\n<tool_call>\n{"name": "python_code", "arguments": '
    '{"code": "print(6*7)"}}\n</tool_call>\n<tool_call>\n{"name": "python_code", "arguments": {"code": "print(1)"}}\n</tool_call>',
    "llama3": '<|python_tag|>{"name": "python_code", "parameters": {"code": "print(6*7)"}}; '
    '{"name": "python_code", "parameters": {"code": "print(1)"}}',
}


@pytest.fixture(scope="module")
def tiny_tok():
    from support.models import tokenizer_dir
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir())


@pytest.mark.parametrize("fmt", ["hermes", "qwen3", "llama3"])
@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_loop_per_format(tiny_tok, fmt, stream):
    """A function-calling loop through the client: parallel calls parsed, results sent as
    role ``tool``, the final answer; one trajectory whose sampled tokens are the replies."""
    from support.scripted_sampler import ScriptedSampler

    replies = [REPLIES[fmt], "The answer is 42."]
    sampler = ScriptedSampler(tiny_tok, lambda rid, k: replies[k])
    gt = GatewayThread(
        Gateway(sampler, tiny_tok, GatewayConfig(tool_format=fmt, max_model_len=4096))
    )
    try:
        key = gt.open_episode()
        c = _client(gt, key)
        msgs = [{"role": "user", "content": "What is 6*7?"}]
        kw = {"model": "policy", "tools": TOOLS, "stream": stream}
        if stream:
            calls, content = {}, ""
            for ch in c.chat.completions.create(messages=msgs, **kw):
                d = ch.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    calls[tc.index] = {"id": tc.id, "type": "function",
                                       "function": {"name": tc.function.name, "arguments": tc.function.arguments}}  # fmt: skip
            msg = {
                "role": "assistant",
                "content": content or None,
                "tool_calls": list(calls.values()),
            }
        else:
            r = c.chat.completions.create(messages=msgs, **kw)
            assert r.choices[0].finish_reason == "tool_calls"
            msg = r.choices[0].message.model_dump(exclude_none=True)
        calls = msg["tool_calls"]
        assert [json.loads(x["function"]["arguments"]) for x in calls] == [
            {"code": "print(6*7)"},
            {"code": "print(1)"},
        ]
        msgs.append(msg)
        msgs += [
            {"role": "tool", "tool_call_id": x["id"], "content": out}
            for x, out in zip(calls, ["42", "1"])
        ]
        r2 = openai.OpenAI(base_url=gt.gateway.url(key), api_key="x").chat.completions.create(
            model="policy", messages=msgs, tools=TOOLS
        )
        assert (
            r2.choices[0].message.content == "The answer is 42."
            and not r2.choices[0].message.tool_calls
        )
        httpx.post(gt.gateway.url(key)[:-3] + "/end", json={"reward": 1})
        (t,) = gt.wait(key)
        sampled = _sampled(t)
        eos = tiny_tok.eos_token_id
        assert (
            tiny_tok.decode(sampled)
            == replies[0] + tiny_tok.eos_token + replies[1] + tiny_tok.eos_token
        )
        assert sampled.count(eos) == 2 and t.tool_calls == 2 and t.invalid_tool_calls == 0
        # what the sampler was given on turn 2 is the trajectory's prefix, token for token
        (_, p2, _) = sampler.calls[1]
        assert p2 == t.prompt_ids + t.response_ids[: len(p2) - len(t.prompt_ids)]
        assert gt.gateway.stats["turns_break"] == 0
    finally:
        gt.close()


def test_malformed_call_is_counted_and_returned_as_text(tiny_tok):
    from support.scripted_sampler import ScriptedSampler

    bad = '<tool_call>{"name": "python_code", "arguments": {</tool_call>'
    gt = GatewayThread(
        Gateway(
            ScriptedSampler(tiny_tok, lambda rid, k: bad),
            tiny_tok,
            GatewayConfig(max_model_len=4096),
        )
    )
    try:
        key = gt.open_episode()
        r = _client(gt, key).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], tools=TOOLS
        )
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
        assert gt.gateway.episodes[key].invalid_tool_calls == 1
    finally:
        gt.close()


def test_template_that_drops_history_starts_a_new_sample(tiny_tok):
    """With a template that drops earlier reasoning, the second turn cannot extend the
    first: it becomes a second training sample with its own prompt (counted)."""
    from support.chat_templates import DROPS_THINK_TEMPLATE
    from support.scripted_sampler import ScriptedSampler

    tok = tiny_tok.__class__.from_pretrained(tiny_tok.name_or_path)
    tok.chat_template = DROPS_THINK_TEMPLATE
    replies = ["<think>\nhmm\n</think>\nFirst.", "Second."]
    sampler = ScriptedSampler(tok, lambda rid, k: replies[k])
    gt = GatewayThread(
        Gateway(sampler, tok, GatewayConfig(tool_format="qwen3", max_model_len=4096))
    )
    try:
        key = gt.open_episode("grp")
        c = _client(gt, key)
        msgs = [{"role": "user", "content": "a"}]
        r = c.chat.completions.create(model="policy", messages=msgs)
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "b"},
        ]
        c.chat.completions.create(model="policy", messages=msgs)
        gt.call(lambda: _async(gt.gateway.end, key, 1.0))
        t1, t2 = gt.wait(key)
        assert gt.gateway.stats["turns_break"] == 1
        assert t2.trajectory_id == key + "/1" and t2.group_id == t1.group_id == "grp"
        assert t2.prompt_ids == sampler.calls[1][1] and "hmm" not in tok.decode(t2.prompt_ids)
        assert (
            tok.decode(_sampled(t2)) == "Second." + tok.eos_token and t2.reward == t1.reward == 1.0
        )
    finally:
        gt.close()


async def _async(fn, *a):
    return fn(*a)


def test_example_agent_runs_the_python_tool_through_the_gateway(tiny_tok, tool_url):
    """examples/openai_agent.py against the gateway and a real tool server: the model's
    call is run in the sandbox and its output is in the recorded (masked) tokens."""
    import importlib.util
    from pathlib import Path

    from support.scripted_sampler import ScriptedSampler

    path = Path(__file__).parents[2] / "examples" / "openai_agent.py"
    spec = importlib.util.spec_from_file_location("openai_agent", path)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    replies = [REPLIES["hermes"], "The answer is \\boxed{42}."]
    sampler = ScriptedSampler(tiny_tok, lambda rid, k: replies[k])
    gt = GatewayThread(Gateway(sampler, tiny_tok, GatewayConfig(max_model_len=4096)))
    try:
        key = gt.open_episode()
        assert agent.run(gt.gateway.url(key), tool_url, "What is 6*7?") == replies[1]
        gt.call(lambda: _async(gt.gateway.end, key, 1.0))
        (t,) = gt.wait(key)
        observed = tiny_tok.decode([i for i, m in zip(t.response_ids, t.loss_mask) if not m])
        assert "42" in observed and "python_code" in tiny_tok.decode(t.prompt_ids)
        assert t.tool_calls == 2 and t.num_turns == 2
    finally:
        gt.close()


def test_a_second_concurrent_call_on_one_key_is_refused(tiny_tok):
    from concurrent.futures import ThreadPoolExecutor

    from support.scripted_sampler import ScriptedSampler

    sampler = ScriptedSampler(tiny_tok, lambda rid, k: "ok", delay_s=1.0)
    gt = GatewayThread(Gateway(sampler, tiny_tok, GatewayConfig(max_model_len=4096)))
    try:
        key = gt.open_episode()
        c = _client(gt, key)

        def call():
            return c.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "x"}]
            )

        with ThreadPoolExecutor(2) as ex:
            futs = [ex.submit(call) for _ in range(2)]
            errs = [f.exception() for f in futs]
        assert sum(e is None for e in errs) == 1
        (err,) = [e for e in errs if e is not None]
        assert isinstance(err, openai.ConflictError) and err.code == "call_in_flight"
    finally:
        gt.close()


def test_a_call_in_atomic_markup_tokens_is_parsed(tmp_path):
    """With ``model.tiny.markup`` the call's JSON is two tokens of the reply (as a model
    trained on them samples it); the gateway's decoded text still holds the JSON, the
    call is parsed, and the next turn extends the sampled tokens."""
    from support.scripted_sampler import ScriptedSampler

    from verltool_jax.models.tiny import NATIVE_CALL_MARKUP, build_tokenizer

    tok = build_tokenizer(tmp_path, markup=NATIVE_CALL_MARKUP)
    call = (
        '<tool_call>\n{"name": "python_code", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
    )
    replies = [call, "<answer>42</answer>"]
    sampler = ScriptedSampler(tok, lambda rid, k: replies[k], canonical=True)
    gt = GatewayThread(Gateway(sampler, tok, GatewayConfig(max_model_len=4096)))
    try:
        key = gt.open_episode()
        c = _client(gt, key)
        msgs = [{"role": "user", "content": "What is 6 * 7?"}]
        r = c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        msg = r.choices[0].message.model_dump(exclude_none=True)
        (tc,) = msg["tool_calls"]
        assert tc["function"]["name"] == "python_code"
        assert json.loads(tc["function"]["arguments"]) == {"code": "print(6 * 7)"}
        msgs += [msg, {"role": "tool", "tool_call_id": tc["id"], "content": "42\n"}]
        c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        httpx.post(gt.gateway.url(key)[:-3] + "/end", json={"reward": 1})
        (t,) = gt.wait(key)
        first = sampler.calls[0]
        sampled = _sampled(t)
        for m in NATIVE_CALL_MARKUP:
            assert tok.convert_tokens_to_ids(m) in sampled
        assert len(sampled) < len(call)  # not one token per character
        assert t.tool_calls == 1 and t.invalid_tool_calls == 0
        assert gt.gateway.stats["turns_break"] == 0 and first[1] == t.prompt_ids
    finally:
        gt.close()
