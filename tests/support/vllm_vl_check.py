"""The vLLM sampler serving a tiny Qwen2.5-VL with images, run as its own process
(``python -m support.vllm_vl_check WORKDIR`` with ``tests`` on PYTHONPATH; prints one JSON line of results for
``tests/samplers/test_vllm_images.py``).

Its own process because torchvision must be made importable (``torchvision_cpu.enable``)
before transformers is first imported, and the test session imports transformers early.
Checked: images of two sizes in one prompt, the trainer's logprobs of vLLM's tokens before
and after weight syncs of both towers (in place, and through vLLM's reload), a text request
beside them, a two-turn rollout through the real image tool, and bad requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(workdir: str) -> dict:
    from verltool_jax.samplers.torchvision_cpu import enable

    res = {"torchvision": enable()}
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from transformers import AutoTokenizer

    from verltool_jax.models import load_hf
    from verltool_jax.models.image_inputs import ImageProcessor, stack_images
    from verltool_jax.models.logprobs import token_logprobs
    from verltool_jax.models.tiny import build_tiny_vl_hf
    from verltool_jax.models.vision_language import vl_inputs
    from verltool_jax.samplers.base import SamplerRequestError, SamplingParams
    from verltool_jax.samplers.vllm_sampler import VLLMSampler

    # vLLM's CPU attention needs head_dim >= 32: hidden 128 over 4 heads
    path = build_tiny_vl_hf(
        os.path.join(workdir, "vl"),
        vocab_size=400,
        seed=0,
        hidden_size=128,
        mrope_section=(4, 6, 6),
    )
    model = load_hf(path)
    cfg = model.config
    tok = AutoTokenizer.from_pretrained(path)
    proc = ImageProcessor(cfg, 64 * 64, min_pixels=16 * 16)
    rng = np.random.default_rng(0)
    pics = [
        rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        rng.integers(0, 256, (30, 50, 3), dtype=np.uint8),
    ]  # resized to 32 x 48
    ims = [proc(p) for p in pics]
    text = tok.encode("Which shape is it?", add_special_tokens=False)
    prompt = text + proc.placeholder_ids(ims[0]) + text + proc.placeholder_ids(ims[1]) + text
    res["image_tokens"] = [im.num_tokens for im in ims]
    graphdef, params = nnx.split(model, nnx.Param)
    sp = SamplingParams(max_tokens=6, temperature=1.0, seed=1)

    def trainer_lps(m, ids, images, n):
        seq = np.asarray([ids])
        tgt = np.asarray([list(ids[1:]) + [0]])
        kw = vl_inputs(cfg, seq, None, *stack_images(images)) if images else vl_inputs(cfg, seq)
        lp = token_logprobs(
            m, jnp.asarray(seq), jnp.ones_like(jnp.asarray(seq)), jnp.asarray(tgt), 1.0, **kw
        )
        return np.asarray(lp)[0, len(ids) - n - 1 : len(ids) - 1]

    def gap(m, p, images, c):
        lps = trainer_lps(m, p + c.token_ids, images, len(c.token_ids))
        return float(np.abs(lps - np.asarray(c.logprobs)).max())

    key = [jax.random.PRNGKey(3)]

    def perturbed():
        def f(x):
            key[0], k = jax.random.split(key[0])
            return x + 0.1 * jax.random.normal(k, x.shape, x.dtype)

        p2 = jax.tree.map(f, params)
        return p2, nnx.merge(graphdef, p2)

    s = VLLMSampler(path, max_model_len=512, dtype="float32", name="vl")
    try:
        gen = lambda p, images=None: asyncio.run(s.generate(p, sp, images=images))
        c = gen(prompt, ims)
        res["tokens"] = len(c.token_ids)
        res["gap_before_sync"] = gap(model, prompt, ims, c)
        for mode in ("auto", "reload"):
            s.sync_mode = mode
            p2, m2 = perturbed()
            s.update_weights(p2, s.version + 1)
            res[f"sync_path_{mode}"] = s.last_sync.get("sync_path")
            c = gen(prompt, ims)
            res[f"gap_after_{mode}_sync"] = gap(m2, prompt, ims, c)
            # the images matter: the trainer with other pixels disagrees
            other = [proc(255 - p) for p in pics]
            res[f"gap_other_pixels_{mode}"] = float(
                np.abs(
                    trainer_lps(m2, prompt + c.token_ids, other, len(c.token_ids))
                    - np.asarray(c.logprobs)
                ).max()
            )
            ct = gen(text + text)
            res[f"gap_text_{mode}"] = gap(m2, text + text, [], ct)
        errors = {}
        for name, (p, images) in {
            "missing_placeholders": (text + text, ims[:1]),
            "wrong_run_length": (text + proc.placeholder_ids(ims[1]) + text, ims[:1]),
            "not_image_input": (prompt, [pics[0], pics[1]]),
        }.items():
            try:
                gen(p, images)
                errors[name] = "accepted"
            except SamplerRequestError as e:
                errors[name] = str(e)
        res["errors"] = errors
        res["alive_after_errors"] = len(gen(text, None).token_ids)
        res.update(rollout(s, m2, tok, proc, pics[0]))
    finally:
        s.close()
    return res


def rollout(sampler, model, tok, proc, picture) -> dict:
    """Two turns through the real image tool: turn 1 a scripted crop call (the random model
    would not write one), turn 2 vLLM; the trainer's batch and logprobs of vLLM's turn."""
    import base64
    import io

    import numpy as np
    from flax import nnx
    from PIL import Image

    from tool_server.client import ToolClient
    from tool_server.launcher import run_server
    from verltool_jax.algos.config import AlgoConfig
    from verltool_jax.data.images import multimodal_prompt
    from verltool_jax.models.logprobs import token_logprobs
    from verltool_jax.rollout.agent_loop import PromptItem, run_rollout
    from verltool_jax.rollout.config import RolloutConfig
    from verltool_jax.samplers.base import Completion
    from verltool_jax.train.batch import batch_from_trajectories
    from verltool_jax.train.step import compute_logprobs

    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    call = '<tool_call>{"name": "crop_image", "arguments": {"bbox": [0, 0, 32, 32]}}</tool_call>'
    requests = []

    class Scripted:
        version = 0

        async def generate(self, ids, params, request_id=None, images=None):
            requests.append((list(ids), len(images or [])))
            if len(requests) == 1:
                t = tok.encode(call, add_special_tokens=False)
                return Completion(t, [0.0] * len(t), "stop", "</tool_call>")
            return await sampler.generate(ids, params, request_id, images=images)

    msgs = [{"role": "user", "content": "<image>What shape is it? Crop first."}]
    ids, images = multimodal_prompt(tok, msgs, [url], proc)
    cfg = RolloutConfig(max_turns=2, max_response_tokens=200, seed=3, max_action_tokens=12)

    async def go(u):
        async with ToolClient(u) as client:
            return await run_rollout(
                [PromptItem(ids, {"extra_info": {"images": [url]}}, "g0", images)],
                1,
                Scripted(),
                client,
                tok,
                cfg,
                image_processor=proc,
            )

    with run_server(tools=["image"], timeout=10) as u:
        (group,) = asyncio.run(go(u))
    traj = group[0]
    full = traj.prompt_ids + traj.response_ids
    last_ids, n_images = requests[-1]
    n_final = len(full) - len(last_ids)
    batch = batch_from_trajectories([traj], [1.0], pad_id=0, max_len=512, pad_to_multiple=16)
    row = batch["input_ids"][0, : len(full)].tolist()
    graphdef, params = nnx.split(model, nnx.Param)
    lp = np.asarray(compute_logprobs(graphdef, params, batch, AlgoConfig(), token_logprobs, 1))[0]
    ours = lp[len(last_ids) - 1 : len(last_ids) - 1 + n_final]
    return {
        "rollout_error": traj.error,
        "rollout_tool_calls": traj.tool_calls,
        "rollout_images": [(im.source, list(im.image.grid_thw)) for im in traj.images],
        "rollout_last_request_images": n_images,
        "rollout_final_tokens": n_final,
        "rollout_ids_match": row == last_ids + traj.response_ids[-n_final:],
        "rollout_gap": float(np.abs(ours - np.asarray(traj.logprobs[-n_final:])).max())
        if n_final
        else None,
    }


if __name__ == "__main__":
    out = main(sys.argv[1])
    print("RESULT " + json.dumps(out), flush=True)
