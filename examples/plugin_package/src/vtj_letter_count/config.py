"""Training configs for the letter_count task (``get_config(arg)``, as in verltool-jax's
``configs/``), built only from verltool-jax's public API: the run's defaults and the task
section of the ``letter_count`` plugin.

    python -m verltool_jax.train --config <site-packages>/vtj_letter_count/config.py:tiny

``tiny`` (the only variant): a tiny random Qwen2 model (built locally in seconds), SFT
warm start of 2 steps, then 2 GRPO steps on the JAX sampler with the ``letter_count``
tool; one to two minutes on two CPU cores. A smoke run of the plumbing, not a learning
run.
"""

from __future__ import annotations

import ml_collections

from verltool_jax.run_config import default_config_dict
from verltool_jax.tasks import task_section

VARIANTS = ("tiny",)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant = (arg or "").strip() or "tiny"
    if variant not in VARIANTS:
        raise ValueError(
            f"vtj_letter_count/config.py: unknown variant {variant!r}; choose one of {list(VARIANTS)}"
        )
    c = default_config_dict()
    c.task = task_section("letter_count")
    c.task.num_train = 16
    c.task.num_eval = 4
    c.task.num_demos = 8
    c.tool_server.tools = ("letter_count",)
    c.rollout.action_stop_strings = ("</count>",)
    c.rollout.final_stop_strings = ("</answer>",)
    # a tiny random model with a BPE tokenizer trained locally (model.path empty)
    c.model.path = ""
    c.model.family = "qwen2"
    c.model.max_seq_len = 256
    c.sampler.max_model_len = 256
    c.sampler.backend = "jax"
    for k, v in dict(
        vocab_size=512,
        hidden_size=64,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=64,
        intermediate_size=128,
        seed=0,
    ).items():
        c.model.tiny[k] = v
    c.rollout.n_samples = 2
    c.rollout.max_turns = 2
    c.rollout.max_prompt_tokens = 128
    c.rollout.max_response_tokens = 32
    c.rollout.max_obs_tokens = 8
    c.algo.mini_batch_size = 4
    c.algo.micro_batch_size = 4
    c.sft.steps = 2
    c.sft.batch_size = 4
    c.sft.warmup_steps = 0
    c.trainer.steps = 2
    c.trainer.batch_groups = 2
    c.trainer.ckpt_every = 1
    c.trainer.eval_every = 0
    c.data.max_eval_examples = 4
    c.reward.num_workers = 0
    c.logging.report_trajectories = 4
    c.trainer.out_dir = "runs/letter_count_tiny"
    return c
