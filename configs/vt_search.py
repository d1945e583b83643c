"""VT-Search: answer NQ / HotpotQA questions by searching a local corpus (Search-R1 style).

    python -m tool_server.retrieval build --corpus CORPUS... --out runs/qa_index --kind bm25 \\
        --questions QUESTIONS... --answerable-out runs/qa_index/answerable.json
    python -m verltool_jax.train --config configs/vt_search.py:smol \\
        --config.task.train_files=nq_open_dev.jsonl,hotpotqa_dev_subsampled.jsonl \\
        --config.task.corpus_files=CORPUS...

The model writes ``<search> query </search>``, reads the top-3 passages in
``<information>...</information>`` (tool ``search_retrieval`` over
``tool_server.tool_opt.retrieval_index``) and answers in ``<answer>...</answer>``,
scored by exact match (``qa_em``, chosen by data_source; ``reward.name=qa_f1`` for F1)
minus ``reward.format_penalty`` when there is no answer.

``judge`` (the ``smol`` recipe) and ``tiny_judge`` (the ``tiny`` one) add an LLM judge
beside exact match, for open answers that exact match misses (``use_answer_judge``): the
reward is ``0.5 * EM + 0.5 * judge`` with the judge's 0-10 grade of the extracted answer
against the gold answers (``reward.judge``; rewards/judge.py), from an OpenAI-compatible
server at ``reward.judge.base_url`` (e.g. ``vllm serve Qwen/Qwen2.5-7B-Instruct --port
8000``); a full-marks verdict also counts as correct. An unparseable verdict scores 0 and
is counted (``rollout/judge_failures``) rather than stopping the run.

Variants (``:arg``): ``smol`` (default; SmolLM2-135M-Instruct, CPU sizes: LoRA on the top
8 layers, 30 SFT steps on 256 demonstrations made from the index, then GRPO; the run
``experiments/search_smollm2.py`` makes of it), ``tiny`` (a tiny random model, seconds,
for tests) and ``paper``: the Search-R1 recipe of VerlTool's
``examples/train/search_r1/train_3b.sh``: Qwen2.5-3B, GRPO with n=16, 512 prompts per
step, PPO mini-batch 64 prompts (= 1024 trajectories here: our mini-batch counts
trajectories), low-variance KL (k3) 1e-4 as a loss, lr 1e-6, top-3 passages, 2 turns
(Search-R1 evaluates with up to 4: ``--config.rollout.max_turns=4``), prompt/response
4096 tokens, observations 1024, no format penalty (Search-R1's format score is 0).
``model.path`` of ``paper`` names the hub model; pass a local checkpoint folder.

Expected on 2 CPU cores (``smol``, through ``experiments/search_smollm2.py``): about
45 min per seed (SFT, then 10 GRPO steps, each evaluated on 200 questions); exact match
0 as it comes, 0.015 after SFT, unchanged after GRPO (no rollout matched a gold answer).
``tiny``: seconds. See docs/tasks/retrieval_qa.md.
"""

from __future__ import annotations

import ml_collections

from configs import base
from configs.common import add_qa_task, parse_variant, use_smollm2_lora, use_tiny_model

VARIANTS = ("smol", "tiny", "paper", "judge", "tiny_judge")

# The judge of the ``judge`` variants: a local OpenAI-compatible server (vllm serve).
JUDGE_URL = "http://127.0.0.1:8000/v1"
JUDGE_MODEL = "Qwen/Qwen2.5-7B-Instruct"


def use_answer_judge(c: ml_collections.ConfigDict) -> None:
    """An LLM judge of the extracted answer beside exact match (weight 0.5 each)."""
    j = c.reward.judge
    j.backend = "openai"
    j.base_url = JUDGE_URL
    j.model = JUDGE_MODEL
    j.grade = "answer"
    j.weight = 0.5
    j.on_error = "zero"
    j.max_tokens = 128


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant = parse_variant(arg, VARIANTS, "smol", "configs/vt_search.py")
    c = base.get_config()
    add_qa_task(c, prompt="search_r1")
    c.tool_server.tools = ("search_retrieval",)
    c.rollout.action_stop_strings = ("</search>",)
    c.rollout.obs_template = "\n{obs}\n"  # the tool already wraps passages in <information>
    c.rollout.max_turns = 2
    c.reward.format_penalty = 0.1
    c.algo.kl_coef = 1e-4
    c.algo.kl_estimator = "k3"  # verl's low_var_kl
    c.trainer.out_dir = f"runs/vt_search_{variant}"
    if variant in ("judge", "tiny_judge"):
        use_answer_judge(c)

    if variant in ("smol", "judge"):
        # Sized for 2 CPU cores, as configs/vt_math.py:smol: LoRA on the top 8 layers, a
        # warm start on demonstrations (search the question, answer from the passages:
        # the 135M model as it comes never writes the tags), then short GRPO.
        use_smollm2_lora(c, max_len=1536, num_demos=256, sft_steps=30)
        c.rollout.max_prompt_tokens = 256
        c.rollout.max_response_tokens = 640
        c.rollout.max_action_tokens = 64
        c.rollout.max_obs_tokens = 512  # three passages, most of them whole
        c.trainer.steps = 10
        c.reward.num_workers = 1
    elif variant in ("tiny", "tiny_judge"):
        use_tiny_model(c)
        c.model.max_seq_len = 2048  # demonstrations show three passages whole
        c.sampler.max_model_len = 2048
        c.sft.batch_size = 4
    else:
        c.model.path = "Qwen/Qwen2.5-3B"
        c.model.family = "qwen2"
        c.model.dtype = "bfloat16"
        c.model.remat_policy = "full"
        c.model.max_seq_len = 8192
        c.sampler.max_model_len = 8192
        c.sampler.dtype = "bfloat16"
        c.sampler.enforce_eager = False
        c.sampler.gpu_memory_utilization = 0.6
        c.rollout.n_samples = 16
        c.rollout.max_prompt_tokens = 4096
        c.rollout.max_response_tokens = 4096
        c.rollout.max_action_tokens = 2048
        c.rollout.max_obs_tokens = 1024
        c.rollout.temperature = 1.0
        c.algo.mini_batch_size = 64 * 16
        c.algo.micro_batch_size = 8
        c.optimizer.lr = 1e-6
        c.trainer.steps = 1005
        c.trainer.batch_groups = 512
        c.trainer.ckpt_every = 100
        c.trainer.eval_every = 50
        c.reward.format_penalty = 0.0
        c.reward.num_workers = 8
        c.task.num_eval = 1000
    return c
