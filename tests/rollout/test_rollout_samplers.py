"""The agent loop with the real samplers and the real tool server.

A random-init tiny model does not write actions by itself, so these runs cut each turn
at ``max_action_tokens`` and close it with ``close_action_on_length`` (the appended
closing tag has loss mask 0); the tool server answers such actions with an observation
saying no tool accepts them (or, when the model happened to sample an opening tag, with
what the tool made of the body), which the loop appends like any other. The scripted-sampler
tests in ``test_agent_loop.py`` cover the successful-tool paths.

Token-in/token-out is checked against the model itself: the training sequence
(prompt + response ids, as recorded) is re-scored with the HF model and its logprobs on
the sampled tokens must equal the sampler's. Any re-tokenization would misalign them.
"""

import asyncio
import os

import pytest
from support.rollout_fixtures import keyed_items

from tool_server.client import ToolClient
from verltool_jax.rollout.agent_loop import PromptItem, make_formatter
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.producer import RolloutProducer
from verltool_jax.rollout.queue import TrajectoryQueue

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPT = "<|im_start|>user\nWhat is 6 * 7? Use python.<|im_end|>\n<|im_start|>assistant\n"
CFG = RolloutConfig(
    max_turns=2,
    max_response_tokens=96,
    max_action_tokens=8,
    max_obs_tokens=16,
    close_action_on_length="</python>",
    temperature=1.0,
    obs_template="<result>{obs}</result>",
)


@pytest.fixture(scope="module")
def tiny_dir():
    from support.samplers import sampler_ckpt

    return sampler_ckpt()  # the checkpoint behind the session's shared vLLM engine


def hf_logprobs(tiny_dir, ids, start):
    """log softmax of the HF model's logits at positions predicting ids[start:]."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[i - 1, ids[i]]) for i in range(start, len(ids))]


def accepted_by_a_tool(action: str) -> bool:
    """Whether one of the test server's tools (python_code, sql, sleep_search) parses it."""
    from tool_server.kit.search import parse_query_action
    from tool_server.kit.tags import last_tag_body
    from tool_server.tools.python_code import extract_code

    return (
        extract_code(action) is not None
        or last_tag_body(action, "sql") is not None
        or parse_query_action(action, "search")[1]
    )


def check_records(groups, tok, tiny_dir, version):
    trajs = [t for g in groups for t in g]
    assert len(trajs) == 4 and len({t.trajectory_id for t in trajs}) == 4
    closing = tok.convert_tokens_to_ids("</python>")
    # A random model samples EOS with probability ~1/512 per token, so now and then a
    # trajectory ends in its first turn; the rest must have gone through the tool server.
    early_eos = [t for t in trajs if t.termination == "eos" and t.tool_calls == 0]
    assert len(early_eos) <= 1, [(t.termination, t.num_turns) for t in trajs]
    for t in trajs:
        t.check()
        assert t.termination in ("max_turns", "budget", "eos"), (t.termination, t.error)
        if t in early_eos:
            assert t.num_turns == 1 and sum(t.loss_mask) == len(t.response_ids)
            continue
        assert t.num_turns >= 2 and t.tool_calls >= 1
        assert t.versions[0] == version  # stamped from Completion.policy_version
        # the server answered every action with an observation; an action is invalid
        # unless a tool's own parser takes it (a random model now and then samples an
        # opening tag such as <python>, and then the sandbox really runs the body)
        assert len(t.observations) == t.tool_calls
        assert t.invalid_tool_calls == sum(not accepted_by_a_tool(a) for a in t.actions), (
            t.actions,
            t.observations,
        )
        # loss mask: exactly the sampled tokens
        assert sum(t.loss_mask) == sum(t.gen_tokens)
        for _i, (m, v, lp) in enumerate(zip(t.loss_mask, t.versions, t.logprobs)):
            if m:
                assert v == version and lp < 0.0
            else:
                assert v == -1 and lp == 0.0
        # each unsampled run = the closing tag we appended + the observation, tokenized alone
        runs, cur = [], []
        for tid_, m in zip(t.response_ids, t.loss_mask):
            if m == 0:
                cur.append(tid_)
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        fmt = make_formatter(tok, CFG)
        assert len(runs) == t.tool_calls
        for run_, obs in zip(runs, t.observations):
            body = run_[1:] if run_[0] == closing else run_
            assert body == fmt(obs)[0]
        # every action ends on a stop string: the closing tag we appended after
        # max_action_tokens, or (a random model now and then samples one) its own
        assert t.actions and all(a.endswith(CFG.action_stop_strings) for a in t.actions), t.actions
        # token-in/token-out: the model's own logprobs of the recorded sequence
        ids = t.prompt_ids + t.response_ids
        ref = hf_logprobs(tiny_dir, ids, len(t.prompt_ids))
        got = [(r, s) for r, s, m in zip(ref, t.logprobs, t.loss_mask) if m]
        assert max(abs(r - s) for r, s in got) < 2e-2, got[:5]


async def run(sampler, tok, url):
    q = TrajectoryQueue(max_groups=4, max_staleness=0)
    prompts = [
        PromptItem(tok.encode(PROMPT, add_special_tokens=False), group_id=g) for g in ("a", "b")
    ]
    async with ToolClient(url) as c:
        groups = await RolloutProducer(
            keyed_items(prompts),
            n_samples=2,
            sampler=sampler,
            tool_client=c,
            tokenizer=tok,
            cfg=CFG,
            queue=q,
        ).run()
    assert q.depth() == 2
    return groups


@pytest.mark.vllm
def test_agent_loop_with_vllm_sampler(tiny_dir, sampler_tokenizer, tool_url, vllm_sampler):
    groups = asyncio.run(run(vllm_sampler, sampler_tokenizer, tool_url))
    check_records(groups, sampler_tokenizer, tiny_dir, version=vllm_sampler.version)


def test_agent_loop_with_jax_sampler(tiny_dir, sampler_tokenizer, tool_url, sampler_flax_model):
    from verltool_jax.samplers.jax_sampler import JAXSampler

    sampler = JAXSampler.from_pretrained(tiny_dir, max_model_len=192, max_batch_size=4)
    try:
        sampler.update_weights(sampler_flax_model, 2)  # same weights, published as version 2
        groups = asyncio.run(run(sampler, sampler_tokenizer, tool_url))
    finally:
        sampler.close()
    check_records(groups, sampler_tokenizer, tiny_dir, version=2)
