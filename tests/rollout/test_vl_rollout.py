"""Images through the rollout with a tiny random Qwen2.5-VL policy: a prompt image and the image
tool's crops as observations, the JAX sampler prefilling the vision tower and decoding with
M-RoPE deltas, the train batch carrying each row's images, trainer / sampler parity of ids and
logprobs, one train step with images, and the bad-input errors."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import pytest
from flax import nnx
from PIL import Image

from tool_server.client import ToolClient, ToolResult
from tool_server.launcher import run_server
from verltool_jax.algos.config import AlgoConfig
from verltool_jax.data.images import multimodal_prompt
from verltool_jax.data.pipeline import PromptPipeline
from verltool_jax.data.rows import DataRowError
from verltool_jax.models import load_hf
from verltool_jax.models.image_inputs import ImageInputError, ImageProcessor
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.rollout.agent_loop import PromptItem, make_formatter, run_rollout
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.turns import TrajectoryBuilder
from verltool_jax.samplers.base import Completion, SamplerRequestError, SamplingParams
from verltool_jax.samplers.jax_sampler import JAXSampler
from verltool_jax.train.batch import batch_from_trajectories
from verltool_jax.train.step import compute_logprobs

MAX_PIXELS = 64 * 64


def data_url(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    """(model, tokenizer, ImageProcessor) of a tiny random Qwen2.5-VL with its own tokenizer
    (patches of 8 px, 2x2 merge: a 64x64 image is 16 placeholder tokens)."""
    from transformers import AutoTokenizer

    from verltool_jax.models.tiny import build_tiny_vl_hf

    path = build_tiny_vl_hf(tmp_path_factory.mktemp("vl"), vocab_size=400, seed=0)
    model = load_hf(path)
    return (
        model,
        AutoTokenizer.from_pretrained(path),
        ImageProcessor(model.config, MAX_PIXELS, min_pixels=16 * 16),
    )


@pytest.fixture(scope="module")
def picture():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def tool_url():
    with run_server(tools=["image"], timeout=10) as u:
        yield u


class ScriptedPolicy:
    """Turns 1..k: the given tool calls (the tiny random model would not write one); the
    last turn: the real JAX sampler. Records every request (ids, images) it receives."""

    def __init__(self, tokenizer, sampler: JAXSampler, actions: list[str]):
        self.tok, self.sampler, self.actions = tokenizer, sampler, list(actions)
        self.requests: list[tuple[list[int], list]] = []
        self.version = 0

    async def generate(self, ids, params, request_id=None, images=None):
        self.requests.append((list(ids), list(images or [])))
        if self.actions:
            toks = self.tok.encode(self.actions.pop(0), add_special_tokens=False)
            return Completion(toks, [0.0] * len(toks), "stop", "</tool_call>")
        return await self.sampler.generate(ids, params, request_id, images=images)


def _call(name: str, **args) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def _rollout(vl, picture, tool_url, actions, max_response_tokens=320):
    model, tok, proc = vl
    msgs = [{"role": "user", "content": "<image>What shape is in the picture? Zoom in first."}]
    ids, images = multimodal_prompt(tok, msgs, [data_url(picture)], proc)
    sampler = JAXSampler(model, tok, max_model_len=512, max_batch_size=2)
    policy = ScriptedPolicy(tok, sampler, actions)
    cfg = RolloutConfig(
        max_turns=3, max_response_tokens=max_response_tokens, seed=3, max_action_tokens=12
    )
    row = {"extra_info": {"images": [data_url(picture)]}}

    async def go():
        async with ToolClient(tool_url) as client:
            return await run_rollout(
                [PromptItem(ids, row, "g0", images)],
                1,
                policy,
                client,
                tok,
                cfg,
                image_processor=proc,
            )

    try:
        (group,) = asyncio.run(go())
    finally:
        sampler.close()
    return group[0], policy, ids


def test_multi_turn_multi_image_trajectory_matches_trainer(vl, picture, tool_url):
    model, tok, proc = vl
    cfg = model.config
    traj, policy, prompt_ids = _rollout(
        vl,
        picture,
        tool_url,
        [
            _call("crop_image", bbox=[0, 0, 32, 32]),
            _call("zoom_in", bbox=[0.25, 0.25, 0.75, 0.75], factor=2),
        ],
    )
    assert traj.error is None and traj.tool_calls == 2 and traj.invalid_tool_calls == 0
    assert traj.termination in ("eos", "budget")
    # every image the policy saw, with where its placeholders sit
    assert [(im.source, im.turn, im.image.grid_thw) for im in traj.images] == [
        ("prompt", 0, (1, 8, 8)),
        ("observation", 1, (1, 4, 4)),
        ("observation", 2, (1, 4, 4)),
    ]
    traj.check()
    full = traj.prompt_ids + traj.response_ids
    for im in traj.images:
        assert full[im.offset - 1] == cfg.vision_start_token_id
        assert (
            full[im.offset : im.offset + im.image.num_tokens]
            == [cfg.image_token_id] * im.image.num_tokens
        )
        assert full[im.offset + im.image.num_tokens] == cfg.vision_end_token_id
    # token in, token out: each request is the record so far, with the images so far
    assert len(policy.requests) == 3
    for k, (ids, imgs) in enumerate(policy.requests):
        assert ids == full[: len(ids)]
        assert [id(x) for x in imgs] == [id(im.image) for im in traj.images[: k + 1]]
    last_ids, _ = policy.requests[-1]
    n_final = len(full) - len(last_ids)
    assert n_final >= 1 and traj.gen_tokens[-1] == n_final
    # the trainer's input ids are exactly the sampler's (last request + what it sampled)
    batch = batch_from_trajectories([traj], [1.0], pad_id=0, max_len=512, pad_to_multiple=16)
    row = batch["input_ids"][0, : len(full)].tolist()
    assert row == last_ids + traj.response_ids[-n_final:]
    # observation tokens, image placeholders included, are never trained on
    p = len(prompt_ids)
    lm = batch["loss_mask"][0]
    img_pos = [im.offset + j for im in traj.images[1:] for j in range(im.image.num_tokens)]
    assert all(lm[q - 1] == 0 for q in img_pos)
    assert lm[p - 1 : p - 1 + len(traj.response_ids)].tolist() == traj.loss_mask
    # logprob parity: the trainer's logprobs of the sampled final turn (behind 3 images)
    graphdef, params = nnx.split(model, nnx.Param)
    lp = np.asarray(compute_logprobs(graphdef, params, batch, AlgoConfig(), token_logprobs, 1))[0]
    start = len(last_ids) - 1
    ours = lp[start : start + n_final]
    theirs = np.asarray(traj.logprobs[-n_final:])
    assert np.abs(ours - theirs).max() < 1e-4, (ours, theirs)
    # the images matter: other pixels give other logprobs
    other = dict(batch, image_pixels=batch["image_pixels"][:, ::-1].copy())
    lp2 = np.asarray(compute_logprobs(graphdef, params, other, AlgoConfig(), token_logprobs, 1))[0]
    assert np.abs(lp2[start : start + n_final] - ours).max() > 1e-3


def test_the_trainers_parity_metric_sees_the_images(vl, picture, tool_url):
    """``sampler_parity`` (the trainer's per-step |trainer - sampler| logprob metric) scores
    an image trajectory with its images: agreement to 1e-4 (without them it was 0.1-0.4)."""
    from verltool_jax.train.metrics import sampler_parity

    model = vl[0]
    traj, _, _ = _rollout(vl, picture, tool_url, [], max_response_tokens=24)
    assert traj.images and traj.error is None
    out = sampler_parity(model, [traj], 0, 1.0, pad_id=0, max_len=512)
    assert out["sync/parity_tokens"] == sum(traj.loss_mask) >= 1
    assert out["sync/logprob_diff_max"] < 1e-4, out


@pytest.mark.slow
def test_jax_sampler_batches_image_requests_like_single_ones(vl, picture):
    """Two image prompts of different sizes decoded together give each the tokens and
    logprobs it gets alone (greedy), and a text-only request beside them is unaffected."""
    model, tok, proc = vl
    small = np.ascontiguousarray(picture[:32, :48])
    reqs = []
    for imgs in ([picture], [small, picture]):
        msgs = [{"role": "user", "content": "".join("<image>" for _ in imgs) + "Which shape?"}]
        reqs.append(multimodal_prompt(tok, msgs, [data_url(a) for a in imgs], proc))
    reqs.append((tok.encode("hello there", add_special_tokens=False), []))
    params = SamplingParams(max_tokens=6, temperature=0.0)

    def run(batch_size, which):
        s = JAXSampler(model, tok, max_model_len=256, max_batch_size=batch_size)
        try:

            async def go():
                return await asyncio.gather(
                    *(s.generate(reqs[i][0], params, images=reqs[i][1]) for i in which)
                )

            return asyncio.run(go())
        finally:
            s.close()

    together = run(3, [0, 1, 2])
    alone = [run(1, [i])[0] for i in range(3)]
    for a, b in zip(together, alone):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_train_step_with_images_updates_the_vision_tower(vl, picture, tool_url):
    import optax

    from verltool_jax.train.state import TrainState
    from verltool_jax.train.step import make_train_step

    model, tok, proc = vl
    traj, _, _ = _rollout(
        vl, picture, tool_url, [_call("crop_image", bbox=[0, 0, 32, 32])], max_response_tokens=200
    )
    text = TrajectoryBuilder(
        "t1",
        "g1",
        tok.encode("no image here", add_special_tokens=False),
        RolloutConfig(),
        tok,
        make_formatter(tok, RolloutConfig()),
    ).traj
    text.response_ids, text.loss_mask = [5, 6, 7], [1, 1, 1]
    text.logprobs, text.versions = [-1.0] * 3, [0] * 3
    batch = batch_from_trajectories([traj, text], [1.0, -1.0], 0, 512, 16)
    assert batch["image_pixels"].shape[0] == 2 and not batch["image_pixels"][1].any()
    opt = optax.sgd(0.5)
    state = TrainState.create(model, opt)
    before = np.asarray(state.params["visual"]["patch_embed"]["kernel"][...])
    step = make_train_step(
        AlgoConfig(mini_batch_size=2, micro_batch_size=1), state.graphdef, opt, donate=False
    )
    new, metrics = step(state, batch)
    assert np.isfinite(float(metrics["loss"])) and float(metrics["skipped_updates"]) == 0
    after = new.params["visual"]["patch_embed"]["kernel"][...]
    assert float(np.abs(np.asarray(after) - np.asarray(before)).max()) > 0


# --- bad input -----------------------------------------------------------------------------
def _builder(vl, proc=True):
    model, tok, p = vl
    cfg = RolloutConfig()
    return TrajectoryBuilder(
        "t",
        "g",
        tok.encode("look", add_special_tokens=False),
        cfg,
        tok,
        make_formatter(tok, cfg, p if proc else None),
    )


def test_bad_tool_images_become_observations(vl, picture):
    b = _builder(vl)
    b.apply_observation(
        ToolResult("cropped", False, True, extra={"image": "data:image/png;base64,AAAA"})
    )
    b.apply_observation(
        ToolResult("big", False, True, extra={"image": data_url(np.zeros((80, 80, 3), np.uint8))})
    )
    assert "cannot be shown: cannot decode image" in b.traj.observations[0]
    assert "over the pixel budget max_pixels=4096" in b.traj.observations[1]
    assert b.traj.images == [] and b.traj.response_ids
    t = _builder(vl, proc=False)
    t.apply_observation(ToolResult("ok", False, True, extra={"image": data_url(picture)}))
    assert "text-only model and cannot see them" in t.traj.observations[0]


def test_bad_data_images_raise_naming_the_row(vl, picture):
    model, tok, proc = vl
    row = {
        "prompt": [{"role": "user", "content": "<image>shape?"}],
        "data_source": "x",
        "reward_model": {"ground_truth": "circle"},
        "images": [data_url(picture)],
    }
    good = PromptPipeline([row], tok, image_processor=proc, shuffle=False).example_at(0)
    assert len(good.images) == 1 and good.prompt_ids.count(model.config.image_token_id) == 16
    cases = [
        (
            dict(row, images=[{"bytes": b"not a png"}]),
            "row 0: field 'images\\[0\\]': cannot decode",
        ),
        (dict(row, images=[data_url(np.zeros((70, 70, 3), np.uint8))]), "row 0: .*pixel budget"),
        (dict(row, images=[data_url(picture)] * 2), "row 0: field 'images' has 2 image"),
    ]
    for r, msg in cases:
        with pytest.raises(DataRowError, match=msg):
            PromptPipeline([r], tok, image_processor=proc, shuffle=False).example_at(0)
    with pytest.raises(DataRowError, match="row 0: .*text-only model"):
        PromptPipeline([row], tok, shuffle=False).example_at(0)
    with pytest.raises(ImageInputError, match="text-only"):
        ImageProcessor(_text_config())


def _text_config():
    from verltool_jax.models.config import ModelConfig

    return ModelConfig(
        vocab_size=64,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        intermediate_size=32,
    )


def test_jax_sampler_refuses_misplaced_images(vl, picture):
    model, tok, proc = vl
    s = JAXSampler(model, tok, max_model_len=128, max_batch_size=1)
    try:
        img = proc(data_url(picture))
        with pytest.raises(SamplerRequestError, match="placeholder runs of lengths \\[\\]"):
            asyncio.run(s.generate([5, 6, 7], SamplingParams(max_tokens=2), images=[img]))
        with pytest.raises(SamplerRequestError, match="must be ImageInput"):
            asyncio.run(s.generate([5, 6, 7], SamplingParams(max_tokens=2), images=[picture]))
        assert s.alive
    finally:
        s.close()


def test_a_sampled_placeholder_token_ends_the_trajectory_before_it(vl):
    model, tok, proc = vl
    b = _builder(vl)
    n0 = len(b.traj.response_ids)
    comp = Completion([5, 6, model.config.image_token_id, 7], [-1.0, -2.0, -3.0, -4.0], "length")
    assert b.apply_completion(comp) is None
    assert b.traj.termination == "error" and "sampled the image placeholder" in b.traj.error
    assert b.traj.response_ids[n0:] == [5, 6] and b.traj.logprobs[n0:] == [-1.0, -2.0]
    b.traj.check()
