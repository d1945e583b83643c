"""Building a run's components from its typed config: the policy checkpoint, tokenizer,
task data, model, metrics writer, reward pool, tool server and sampler pool.

:func:`build_run` is the one place both ``train`` and ``eval`` get them from: a context
manager yielding a :class:`Run` that closes everything it started (sampler engines,
reward workers, the tool server it launched, the writer) on the way out, also on errors.
The sampler starts on the first :meth:`Run.open_sampler`, or, with
``build_run(start_sampler=True)`` (the trainer's RL runs), on a background thread as
soon as the checkpoint is ready, so that the engines start while the trainer loads the
model, the data and the tool server (``open_sampler`` then waits for it). Each part is
timed on the start-up clock (``train/startup.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tool_server.launcher import serve_tools
from verltool_jax.run_config import RunConfig, run_config_from_dict
from verltool_jax.train.startup import Background, cache_base, part, set_up_compilation_cache

if TYPE_CHECKING:
    from verltool_jax.rollout.agent_loop import PromptItem

log = logging.getLogger("verltool_jax.train")


def prepare_model_dir(rc: RunConfig, out_dir: Path) -> Path:
    """The HF checkpoint the run starts from: ``model.path`` if set (an HF directory, a
    ``.gguf`` file or an installed model package, resolved by
    ``models.resolve.resolve_model_path``; a GGUF is converted once into
    ``model.cache_dir``), else a tiny random model of ``model.family`` with the sizes of
    ``model.tiny`` and a tokenizer trained on our own text, built once into
    ``<out_dir>/init_model`` (reused on resume; a run in another folder copies it from
    :func:`tiny_model_cache` when one was built with the same settings and code)."""
    from verltool_jax.models.resolve import is_hf_checkpoint, resolve_model_path

    if rc.model.path:
        return resolve_model_path(rc.model.path, rc.model.cache_dir or None)
    path = out_dir / "init_model"
    if is_hf_checkpoint(path):
        return path
    kept = tiny_model_cache(rc)
    if kept is not None and is_hf_checkpoint(kept):
        log.info("copying the tiny %s model built before from %s", rc.model.family, kept)
        shutil.copytree(kept, path, dirs_exist_ok=True)
        return path
    _build_tiny(rc, path)
    if kept is not None:  # copied whole, then renamed: a reader never sees half of it
        part_dir = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
        shutil.copytree(path, part_dir, dirs_exist_ok=True)
        with contextlib.suppress(OSError):  # another run put it there first
            part_dir.rename(kept)
        shutil.rmtree(part_dir, ignore_errors=True)
    return path


def tiny_model_cache(rc: RunConfig) -> Path | None:
    """Where a tiny model with ``rc``'s settings is kept for the next run (None when the
    run cache is off): ``<cache_base>/tiny-model-<key>``, the key a hash of the family,
    ``model.tiny``, the position limit, the code that builds it (corpus included) and the
    versions of the libraries that write it."""
    from importlib.metadata import version

    base = cache_base(rc.trainer)
    if base is None:
        return None
    from verltool_jax.models import tiny

    what = {
        "family": rc.model.family,
        "tiny": dataclasses.asdict(rc.model.tiny),
        "max_position_embeddings": max(rc.model.max_seq_len, rc.sampler.max_model_len),
        "code": hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest(),
        "libraries": [version(p) for p in ("transformers", "tokenizers", "torch")],
    }
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    return base / f"tiny-model-{key}"


def _build_tiny(rc: RunConfig, path: Path) -> None:
    from verltool_jax.models.tiny import build_tiny_hf, build_tiny_vl_hf, mrope_sections

    t = rc.model.tiny
    log.info("building a tiny %s model in %s", rc.model.family, path)
    if rc.model.family == "qwen2_5_vl":
        sec = mrope_sections(t.hidden_size // t.num_heads)
        build_tiny_vl_hf(
            path,
            vocab_size=t.vocab_size,
            seed=t.seed,
            hidden_size=t.hidden_size,
            num_layers=t.num_layers,
            num_heads=t.num_heads,
            num_kv_heads=t.num_kv_heads,
            intermediate_size=t.intermediate_size,
            mrope_section=sec,
            max_position_embeddings=max(rc.model.max_seq_len, rc.sampler.max_model_len),
            markup=t.markup,
        )
        return
    build_tiny_hf(
        path,
        family=rc.model.family,
        vocab_size=t.vocab_size,
        seed=t.seed,
        hidden_size=t.hidden_size,
        num_layers=t.num_layers,
        num_heads=t.num_heads,
        num_kv_heads=t.num_kv_heads,
        head_dim=t.head_dim,
        intermediate_size=t.intermediate_size,
        max_position_embeddings=max(rc.model.max_seq_len, rc.sampler.max_model_len),
        markup=t.markup,
    )


def load_tokenizer(rc: RunConfig, model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(rc.model.tokenizer_path or str(model_dir))


def prepare_task_files(rc: RunConfig, out_dir: Path, *, eval_only: bool = False) -> dict:
    """Train / eval / SFT file lists: ``data.*`` and ``sft.files`` where given, else the
    files the task ``task.name`` writes under ``<out_dir>/data``. ``eval_only`` (an
    evaluation): only the held-out files (``data.eval_files``, else the task's
    ``prepare_task_eval``); no training or SFT data is read or written."""
    if eval_only:
        evals = rc.data.eval_files
        if not evals and rc.task is not None:
            from verltool_jax.tasks import prepare_task_eval

            evals = tuple(str(p) for p in prepare_task_eval(rc, out_dir / "data"))
        if not evals:
            raise ValueError(
                "no held-out data: give --data FILE, data.eval_files, or a task "
                "(task.name) with held-out files"
            )
        return {"train": (), "eval": tuple(evals), "sft": ()}
    files = {"train": rc.data.train_files, "eval": rc.data.eval_files, "sft": rc.sft.files}
    if rc.task is not None:
        from verltool_jax.tasks import prepare_task

        tf = prepare_task(rc, out_dir / "data")
        sft = tf.sft
        task_evals = tf.eval if isinstance(tf.eval, tuple) else (tf.eval,)
        files = {
            "train": files["train"] or (str(tf.train),),
            "eval": files["eval"] or tuple(str(p) for p in task_evals),
            "sft": files["sft"] or ((str(sft),) if sft else ()),
        }
    if not files["train"] and rc.stage == "rl":
        raise ValueError(
            "no training data: set data.train_files (parquet/JSONL in the verl "
            "layout) or task.name to a known task"
        )
    if (rc.stage == "sft" or rc.sft.steps > 0) and not files["sft"]:
        raise ValueError("SFT needs demonstrations: set sft.files (or sft.steps=0)")
    return files


def trainer_devices(rc: RunConfig, devices: list) -> list:
    """The devices of the trainer's mesh: ``placement.trainer_devices`` (indices into
    ``devices``) or all of them."""
    idx = rc.placement.trainer_devices
    if not idx:
        return list(devices)
    bad = [i for i in idx if i >= len(devices)]
    if bad:
        raise ValueError(
            f"placement.trainer_devices={idx} names devices {bad}, this process "
            f"sees {len(devices)}; fix the indices"
        )
    return [devices[i] for i in idx]


def engine_device_env(rc: RunConfig, engine: int) -> dict:
    """Environment of in-process engine ``engine`` while it starts: with
    ``placement.mode='disjoint'`` its GPU, ``CUDA_VISIBLE_DEVICES=sampler_devices[engine]``
    (vLLM's engine-core process inherits it); otherwise nothing."""
    p = rc.placement
    if p.mode != "disjoint":
        return {}
    if rc.sampler.num_engines != len(p.sampler_devices):
        raise ValueError(
            f"placement.mode='disjoint' runs one engine per sampler device: "
            f"sampler.num_engines={rc.sampler.num_engines} but "
            f"placement.sampler_devices={p.sampler_devices}; make them agree"
        )
    return {"CUDA_VISIBLE_DEVICES": str(p.sampler_devices[engine])}


@contextlib.contextmanager
def _env(values: dict) -> Iterator[None]:

    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def trainer_mesh(rc: RunConfig):
    """The trainer's device mesh of ``mesh_shape`` (axes data, fsdp, tp), or None for
    one device. Batches are split over (data, fsdp), so ``algo.mini_batch_size`` and
    ``algo.micro_batch_size`` must be multiples of data * fsdp."""
    import jax
    import numpy as np

    from verltool_jax.sharding import make_mesh

    shape = list(rc.mesh_shape)
    devices = trainer_devices(rc, jax.devices())
    if -1 not in shape:
        if int(np.prod(shape)) > len(devices):
            raise ValueError(
                f"mesh_shape={tuple(shape)} needs {int(np.prod(shape))} devices, "
                f"this process sees {len(devices)}"
            )
        devices = devices[: int(np.prod(shape))]
    if len(devices) == 1:
        return None
    mesh = make_mesh(shape, devices=devices)
    split = mesh.shape["data"] * mesh.shape["fsdp"]
    for name in ("mini_batch_size", "micro_batch_size"):
        v = getattr(rc.algo, name)
        if v is not None and v % split:
            raise ValueError(
                f"algo.{name}={v} must be a multiple of data * fsdp = {split} "
                f"(mesh_shape={rc.mesh_shape}); change one of them"
            )
    return mesh


def sampler_backend(rc: RunConfig) -> tuple[str, str]:
    """``(backend, why)``: ``rc.sampler.backend`` with "auto" resolved for this machine
    (``samplers.factory.choose_backend``)."""
    from verltool_jax.samplers.factory import accelerator, choose_backend, vllm_available

    return choose_backend(
        rc.sampler.backend, vllm_installed=vllm_available(), platform=accelerator()
    )


def lora_sync_mode(rc: RunConfig) -> tuple[str, str]:
    """``(mode, why)``: ``rc.sampler.lora_sync`` with "auto" resolved for this run's
    sampler backend and platform (``samplers.factory.choose_lora_sync``)."""
    from verltool_jax.samplers.factory import accelerator, choose_lora_sync

    backend, _ = sampler_backend(rc)
    return choose_lora_sync(rc.sampler.lora_sync, backend=backend, platform=accelerator())


def make_sampler(
    rc: RunConfig, model_dir: Path, *, trainer_overlaps: bool | None = None, adapters: bool = True
):
    """The sampler of ``rc.sampler`` placed per ``rc.placement``: ``num_engines`` in-process
    vLLM engines or JAX samplers on the checkpoint ``model_dir`` (none with
    ``placement.mode='remote'``), plus one remote sampler per ``placement.sampler_urls``
    (stock vLLM servers); one engine is returned as is, several make a SamplerPool with
    sticky least-loaded routing. ``backend="auto"`` is resolved by
    ``samplers.factory.choose_backend``; the choice and its reason are logged.
    ``trainer_overlaps``: whether the trainer computes beside the engines (CPU core
    placement); None: it does in the asynchronous rollout mode (evaluation passes False).
    ``adapters``: whether the sampler may be sent LoRA adapters (``sampler.lora_sync``
    resolved to "adapter", :func:`lora_sync_mode`); an evaluation or a pass-rate
    measurement sends merged weights only, so its vLLM engines start without LoRA layers
    (False)."""
    from verltool_jax.samplers.factory import make_sampler as make_backend

    s = rc.sampler
    backend, why = sampler_backend(rc)
    log.info("[trainer] sampler backend: %s (%s)", backend, why)
    serve_lora = adapters and rc.model.lora_rank > 0 and lora_sync_mode(rc)[0] == "adapter"
    engines = []
    if rc.placement.sampler_urls:
        from verltool_jax.samplers.remote_vllm import RemoteVLLMSampler

        engines += [
            RemoteVLLMSampler(
                u,
                model_path=str(model_dir),
                dtype=s.dtype,
                down_grace_s=s.down_grace_s,
                max_restarts=s.max_restarts,
                restart_window_s=s.restart_window_s,
                restart_backoff_s=s.restart_backoff_s,
            )
            for u in rc.placement.sampler_urls
        ]
    for i in range(0 if rc.placement.mode == "remote" else s.num_engines):
        if backend == "vllm":
            kw = dict(
                max_model_len=s.max_model_len,
                dtype=s.dtype,
                seed=s.seed + i,
                gpu_memory_utilization=s.gpu_memory_utilization,
                enforce_eager=s.enforce_eager,
                max_restarts=s.max_restarts,
                restart_window_s=s.restart_window_s,
                restart_backoff_s=s.restart_backoff_s,
                trainer_overlaps=(
                    rc.rollout.mode == "async" if trainer_overlaps is None else trainer_overlaps
                ),
                partial_rollouts=rc.rollout.partial_rollouts,
                # vLLM's LoRA serving, for adapter-only syncs (sampler.lora_sync)
                lora_rank=rc.model.lora_rank if serve_lora else 0,
            )
        else:
            kw = dict(
                max_model_len=s.max_model_len,
                dtype=s.dtype,
                partial_rollouts=rc.rollout.partial_rollouts,
            )
        with _env(engine_device_env(rc, i)):
            engines.append(make_backend(model_dir, backend=backend, name=f"{backend}{i}", **kw))
        placement = getattr(engines[-1], "placement", None)
        if placement is not None:
            log.info("[trainer] vLLM CPU placement: %s", placement.reason)
    if len(engines) == 1:
        return engines[0]
    from verltool_jax.samplers.pool import SamplerPool

    return SamplerPool(engines)


def hf_export(model, tokenizer, path: Path) -> Path:
    """Write the policy as an HF checkpoint (+ tokenizer) that transformers/vLLM load."""
    from verltool_jax.models.hf_io import save_hf

    save_hf(model, path, tokenizer=tokenizer)
    return path


class NullWriter:
    """The metrics writer of a process other than 0 in a multi-host run: writes nothing
    (``write`` returns the record it would have written)."""

    def __init__(self, out_dir: Path):
        self.jsonl_path = Path(out_dir) / "metrics.jsonl"

    def write(self, step: int, metrics: dict) -> dict:
        return {"step": int(step), **metrics}

    def close(self) -> None:
        pass


@dataclass
class Run:
    """One run's components (see :func:`build_run`)."""

    config: RunConfig
    out: Path
    model_dir: Path
    tokenizer: Any
    pad_id: int
    files: dict
    model: Any
    writer: Any
    reward_pool: Any
    tool_url: str
    tool_process: Any | None = None  # the server we started (restartable), if any
    eval_items: list = field(default_factory=list)
    mesh: Any | None = None
    image_processor: Any | None = None  # vision-language policies: ImageProcessor
    sampler: Any | None = None
    sampler_start: Background | None = None  # the sampler starting in the background

    def open_sampler(self, *, trainer_overlaps: bool | None = None, adapters: bool = True):
        """Start the sampler (once) and return it (``trainer_overlaps``, ``adapters``:
        ``make_sampler``); one started in the background is waited for."""
        if self.sampler is None and self.sampler_start is not None:
            self.sampler = self.sampler_start.result()
        if self.sampler is None:
            self.sampler = make_sampler(
                self.config, self.model_dir, trainer_overlaps=trainer_overlaps, adapters=adapters
            )
        return self.sampler

    def prompt_pipeline(self):
        """The training prompts (a grain pipeline, shuffled by ``data.seed``; with
        ``curriculum.enabled`` a :class:`~verltool_jax.data.curriculum.CurriculumPrompts`)
        or None."""
        from verltool_jax.data.pipeline import PromptPipeline

        c = self.config
        if not self.files["train"]:
            return None
        if c.curriculum.enabled:
            from verltool_jax.data.curriculum import CurriculumPrompts
            from verltool_jax.data.pipeline import _prompt_transform
            from verltool_jax.data.readers import read_files

            transform = _prompt_transform(
                self.tokenizer,
                c.rollout.max_prompt_tokens,
                "drop",
                self.image_processor,
                c.rollout.tool_chat(),
            )
            rows = read_files(self.files["train"], c.data.format)
            return CurriculumPrompts(rows, transform, c.curriculum, seed=c.data.seed)
        return PromptPipeline.from_files(
            self.files["train"],
            self.tokenizer,
            fmt=c.data.format,
            seed=c.data.seed,
            shuffle=c.data.shuffle,
            max_prompt_tokens=c.rollout.max_prompt_tokens,
            image_processor=self.image_processor,
            chat=c.rollout.tool_chat(),
        )


@contextlib.contextmanager
def build_run(
    config: Any,
    *,
    out_dir: Path | None = None,
    write_metrics: bool = True,
    eval_only: bool = False,
    start_sampler: bool = False,
) -> Iterator[Run]:
    """Everything a run needs, from a ``ConfigDict`` (validated here) or a RunConfig.
    ``eval_only`` (an evaluation): only the held-out data is prepared
    (:func:`prepare_task_files`) and ``Run.eval_items`` is left empty (the evaluation
    takes its own prompts from ``Run.files["eval"]``). ``start_sampler``: an RL run
    starts its sampler in the background once the checkpoint is ready (module docstring)."""
    with contextlib.ExitStack() as stack:
        yield _build_run(stack, config, out_dir, write_metrics, eval_only, start_sampler)


def _build_run(
    stack: contextlib.ExitStack,
    config: Any,
    out_dir: Path | None,
    write_metrics: bool,
    eval_only: bool,
    start_sampler: bool,
) -> Run:
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.reporting.metrics_writer import MetricsWriter
    from verltool_jax.rewards.compute import RewardPool
    from verltool_jax.runtime import lifeline
    from verltool_jax.train import multihost

    raw = None if isinstance(config, RunConfig) else config
    rc = config if isinstance(config, RunConfig) else run_config_from_dict(config)
    # Before any process is started: each one carries this run's token and dies with it,
    # kill -9 included (verltool_jax/runtime/lifeline.py).
    lifeline.arm()
    set_up_compilation_cache(rc.trainer)  # before anything compiles
    out = Path(out_dir or rc.trainer.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Several processes: process 0 writes the shared files (config, task data, the tiny
    # model) and the metrics; the others wait for it, reuse the model it built and write
    # their task data into out/process<i>/ (the same rows: prepare_task is deterministic).
    primary = multihost.is_primary()
    write_metrics = write_metrics and primary
    if raw is not None and write_metrics:
        (out / "config.json").write_text(raw.to_json(indent=2))
    if not primary:
        multihost.barrier("build_run:prepared")
    data_dir = out if primary else out / f"process{multihost.process_index()}"
    # Data first: a bad question file or retrieval index fails before any model work.
    with part("data"):
        files = prepare_task_files(rc, data_dir, eval_only=eval_only)
    if primary:
        from verltool_jax.plugins import plugins_of_run

        used = plugins_of_run(rc)
        if used:
            log.info("[trainer] plugins: %s", ", ".join(used))
    with part("checkpoint"):
        model_dir = prepare_model_dir(rc, out)
    if primary:
        multihost.barrier("build_run:prepared")
    # Before the sampler starts on its thread: the trainer's devices (JAX's backend must
    # not start while an engine's start sets its device environment, engine_device_env)
    # and the tokenizer and the modules both threads import (two threads importing one
    # module at once can find it half made; _import_before_the_sampler).
    with part("model"):
        mesh = trainer_mesh(rc)
    with part("tokenizer"):
        tokenizer = load_tokenizer(rc, model_dir)
    sampler_start = None
    if start_sampler and rc.stage == "rl":
        with part("imports"):
            _import_before_the_sampler(rc)
        sampler_start = Background("engine", lambda: make_sampler(rc, model_dir))
        stack.callback(sampler_start.close, lambda sampler: sampler.close())
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    with part("model"):
        model = load_hf(
            model_dir,
            mesh=mesh,
            dtype=rc.model.dtype,
            param_dtype=rc.model.param_dtype,
            remat_policy=rc.model.remat_policy,
            scan_layers=rc.model.scan_layers,
        )
        if rc.model.lora_rank:
            from verltool_jax.models.lora import with_lora

            model = with_lora(
                model,
                rc.model.lora_rank,
                rc.model.lora_alpha,
                rc.model.lora_targets,
                rc.model.lora_last_layers,
                seed=rc.trainer.seed,
            )
    image_processor = None
    if model.config.is_vision_language:
        from verltool_jax.models.image_inputs import ImageProcessor

        image_processor = ImageProcessor(model.config)
    lg = rc.logging
    writer: MetricsWriter | NullWriter
    with part("metrics writer"):
        if primary:
            writer = MetricsWriter(
                out,
                tensorboard=lg.tensorboard and write_metrics,
                wandb=lg.wandb and write_metrics,
                wandb_project=lg.wandb_project,
                config=json.loads(raw.to_json()) if raw is not None else None,
            )
        else:
            writer = NullWriter(out)
    stack.callback(writer.close)
    with part("reward workers"):
        reward_pool = RewardPool.from_config(rc.reward)
    stack.callback(reward_pool.close)
    with part("tool server"):
        url, tool_process = stack.enter_context(serve_tools(rc.tool_server, out))
        rc = with_tool_schemas(rc, url, tokenizer)
    eval_items: list[PromptItem] = []
    with part("data"):  # after the tool server: native tool calls render its tools
        if files["eval"] and rc.data.max_eval_examples and not eval_only:  # 0: none
            eval_items = _eval_items(rc, files["eval"], tokenizer, image_processor)
    run = Run(
        config=rc,
        out=out,
        model_dir=model_dir,
        tokenizer=tokenizer,
        pad_id=pad_id,
        files=files,
        model=model,
        writer=writer,
        reward_pool=reward_pool,
        tool_url=url,
        tool_process=tool_process,
        eval_items=eval_items,
        mesh=mesh,
        image_processor=image_processor,
        sampler_start=sampler_start,
    )

    def close_sampler():
        if run.sampler is not None:
            run.sampler.close()

    stack.callback(close_sampler)
    return run


def with_tool_schemas(rc: RunConfig, tool_url: str, tokenizer: Any) -> RunConfig:
    """``rc`` with ``rollout.tools``, the tools' schemas read from the tool server at
    ``tool_url`` (``GET /tools``), for a native tool-call format (``rollout.tool_format``;
    ``rc`` itself with tags). Checks that every served tool's calls can become actions
    here and that the chat template keeps one sequence over tool turns."""
    if not rc.rollout.native:
        return rc
    from tool_server.client import fetch_tool_schemas
    from verltool_jax.chat.render import check_template
    from verltool_jax.rollout.native import check_tools

    rollout = dataclasses.replace(rc.rollout, tools=tuple(fetch_tool_schemas(tool_url)))
    chat = rollout.tool_chat()
    assert chat is not None
    check_tools(chat)
    check = check_template(tokenizer, chat.fmt)
    if check["case"] == "break":
        raise ValueError(
            f"rollout.tool_format={chat.fmt!r}: {check['note']}, and the built-in loop keeps "
            "one sequence per trajectory; train this model through rollout.producer='gateway'"
        )
    log.info("[trainer] native tool calls (%s): %s", chat.fmt, ", ".join(chat.names))
    return dataclasses.replace(rc, rollout=rollout)


def _import_before_the_sampler(rc: RunConfig) -> None:
    """Import what the sampler's thread and this one would otherwise both import at once
    (a module another thread is still executing is found half made: "cannot import name
    ... from partially initialized module"): the sampler's own module, and for vLLM torch
    and vLLM's top level. No loss in wall time: the engine's start, which imports them
    anyway, is the longer path."""
    import importlib

    backend = sampler_backend(rc)[0]
    importlib.import_module(f"verltool_jax.samplers.{backend}_sampler")
    if backend == "vllm":
        importlib.import_module("torch")
        importlib.import_module("vllm")


def _eval_items(rc: RunConfig, eval_files, tokenizer, image_processor) -> list:
    """``data.max_eval_examples`` prompt items in all, taken in turn from each held-out
    file (its rows in order), so every test set is represented; group ids are unique over
    the files (``eval<file>_<row>``)."""
    from verltool_jax.data.pipeline import PromptPipeline
    from verltool_jax.train.evaluate import prompt_items

    eval_items: list[PromptItem] = []
    pipes = [
        PromptPipeline.from_files(
            [f],
            tokenizer,
            fmt=rc.data.format,
            shuffle=False,
            num_epochs=1,
            max_prompt_tokens=rc.rollout.max_prompt_tokens,
            image_processor=image_processor,
            chat=rc.rollout.tool_chat(),
        )
        for f in eval_files
    ]
    live = list(enumerate(pipes))
    while len(eval_items) < rc.data.max_eval_examples and live:
        for j, pipe in list(live):
            got = pipe.next_batch(1)
            if not got:
                live.remove((j, pipe))
            elif len(eval_items) < rc.data.max_eval_examples:
                eval_items += prompt_items(got, f"eval{j}_" if len(pipes) > 1 else "eval")
    return eval_items
