"""VT-VisualReasoner: answer questions about an image, zooming / cropping with the image tool
(Pixel-Reasoner style); the tool's crops come back as image observations.

    python -m verltool_jax.train --config configs/vt_visual.py:tiny

The policy is a vision-language model (Qwen2.5-VL): prompts carry the image (verl's
multimodal rows, ``<image>`` in the user message), the model writes
``<tool_call>{"name": "zoom_in" | "crop_image" | "rotate", ...}</tool_call>``, sees the
resulting image, and answers in ``<answer>...</answer>`` (reward ``visual_answer``).

Variants (``:arg``): ``tiny`` (default; a tiny random Qwen2.5-VL with its own tokenizer on
easy-VQA, the JAX sampler, seconds per step on CPU) and ``paper``: VerlTool's Pixel-Reasoner
recipe: Qwen2.5-VL-7B, GRPO with n=8, 128 prompts per step, up to 3 tool turns.
The Pixel-Reasoner reward adds, per group, the curiosity bonus ``0.5 * [calls > 0] *
max(0, 0.3 - group tool-call rate)`` and ``0.05 * min(1 - calls, 0)`` per extra call
(``reward.curiosity_*`` / ``reward.extra_call_penalty``, added by the trainer to each scored
group: ``rewards.visual_reward.add_curiosity_terms``). ``model.path`` of ``paper`` names the hub model; pass a local
checkpoint folder. ``tiny`` samples with the JAX sampler (its head size, 16, is below what
vLLM's CPU attention takes; ``--config.sampler.backend=vllm --config.model.tiny.hidden_size=128``
serves it with vLLM); ``paper`` with ``auto`` (vLLM on a GPU).

Expected: ``tiny`` runs a few seconds per step on CPU and checks the plumbing; what a tiny
Qwen2.5-VL learns on easy-VQA (held-out 0.365 after SFT -> 0.525 after RL at width 128,
5.5-6.4 min per run on 2 CPU cores) comes from ``experiments/visual_easyvqa.py``, which
adds the SFT warm start on image demonstrations. ``paper`` has not been run. See
docs/tasks/visual.md.
"""

from __future__ import annotations

import ml_collections

from configs import base
from configs.common import parse_variant, set_tiny_model
from verltool_jax.rewards.visual_reward import CuriositySettings
from verltool_jax.tasks import task_section

VARIANTS = ("tiny", "paper")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant = parse_variant(arg, VARIANTS, "tiny", "configs/vt_visual.py")
    c = base.get_config()
    c.task = task_section("easy_vqa")
    c.tool_server.tools = ("image",)
    c.rollout.action_stop_strings = ("</tool_call>",)
    c.rollout.max_turns = 3
    c.reward.name = "visual_answer"
    c.sampler.backend = "jax"
    pixel_reasoner = CuriositySettings()
    c.reward.curiosity_alpha = pixel_reasoner.alpha
    c.reward.curiosity_rate_bound = pixel_reasoner.rate_bound
    c.reward.free_tool_calls = pixel_reasoner.free_calls
    c.reward.extra_call_penalty = pixel_reasoner.beta
    c.trainer.out_dir = f"runs/vt_visual_{variant}"
    if variant == "tiny":
        set_tiny_model(
            c, 512, family="qwen2_5_vl", num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
        )
        c.rollout.n_samples = 2
        c.rollout.max_prompt_tokens = 256
        c.rollout.max_response_tokens = 160
        c.rollout.max_action_tokens = 48
        c.algo.mini_batch_size = 4
        c.algo.micro_batch_size = 4
        c.trainer.steps = 2
        c.trainer.batch_groups = 2
        c.trainer.eval_every = 0
        c.task.num_train = 16
        c.task.num_eval = 4
        c.task.num_demos = 4
        c.reward.num_workers = 0
    else:
        c.sampler.backend = "auto"
        c.model.path = "Qwen/Qwen2.5-VL-7B-Instruct"
        c.model.family = "qwen2_5_vl"
        c.model.dtype = "bfloat16"
        c.model.remat_policy = "full"
        c.model.max_seq_len = 8192
        c.sampler.max_model_len = 8192
        c.rollout.n_samples = 8
        c.rollout.max_prompt_tokens = 4096
        c.rollout.max_response_tokens = 4096
        c.rollout.max_action_tokens = 1024
        c.algo.mini_batch_size = 128 * 8
        c.algo.micro_batch_size = 8
        c.trainer.batch_groups = 128
        c.optimizer.lr = 1e-6
    return c
