"""JAX backend: continuous batching over the Flax model's KV cache (``models/decode.py``).

A worker thread owns a fixed batch of ``max_batch_size`` rows and one KV cache of
``cache_len`` slots. Each iteration it either *admits* waiting requests into free rows
(one jitted prefill over the batch: those rows get their prompt, the others are masked
and keep their state) or runs one jitted *decode step* for every active row; sampling
(temperature, top-k, top-p, per-row seeds) happens inside the same jitted call
(``sampling_ops.sample_tokens``). Each row is finished on the host as soon as it hits a
stop token id / EOS, a stop string (incremental detokenisation) or its token budget;
its caller is answered at once. A request is admitted only if the shared cache index
leaves room for every active row's remaining budget; when no row is active the cache
is reset.

``update_weights`` swaps the parameter reference between two steps (no copy when the
trainer and the sampler share devices); the rows in flight go on with the new weights over
the cache the old ones computed, their completions labelled with the version they started
on. With ``partial_rollouts`` (``rollout.partial_rollouts``) every row in flight is instead
stopped at its current token and continued from its prefix: the cache is reset and the
rows are prefilled again (prompt + tokens so far) with the new weights, and each token
records the version that sampled it (``Completion.token_versions``); a seeded request keeps
its per-position random keys. Shapes are bucketed (prompt block: next power
of two) so a few compilations serve every request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import json
import queue
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .base import (
    PARTIAL_ROLLOUTS_DEFAULT,
    Completion,
    SamplerDeadError,
    SamplerRequestError,
    SamplerTimeoutError,
    SamplingParams,
)
from .stops import StopState
from .validation import check_image_request, effective_max_tokens


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    max_new: int
    future: cf.Future
    version: int
    seed: int
    stop: StopState
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    images: list = field(default_factory=list)  # ImageInput, in placeholder order
    versions: list[int] = field(default_factory=list)  # the version that sampled each token

    @property
    def input_ids(self) -> list[int]:
        """What a prefill of this request takes: the prompt and the tokens so far (a row
        continued after a weight sync is prefilled again from its prefix)."""
        return self.prompt + self.tokens if self.tokens else self.prompt

    @property
    def remaining(self) -> int:
        return self.max_new - len(self.tokens)


@functools.lru_cache(maxsize=8)
def _kernels(graphdef):
    """Jitted ``(prefill+sample, decode+sample)`` for a model structure; shared by every
    sampler of the same model, so a second sampler (a pool) compiles nothing new."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from verltool_jax.models.decode import decode_step, prefill, prefill_images

    from .sampling_ops import row_keys, sample_tokens

    def _prefill(state, cache, ids, mask, new_rows, temp, top_k, top_p, seeds, counts):
        # rows taking a new request forget their old slots and restart at position 0
        cache = cache.replace(
            kv_mask=cache.kv_mask & ~new_rows[:, None],
            positions=jnp.where(new_rows, 0, cache.positions),
        )
        cache, logits = prefill(nnx.merge(graphdef, state), cache, ids, mask)
        tok, lp = sample_tokens(logits, temp, top_k, top_p, row_keys(seeds, counts))
        return cache, tok, lp

    def _decode(state, cache, tokens, active, temp, top_k, top_p, seeds, counts):
        cache, logits = decode_step(nnx.merge(graphdef, state), cache, tokens, active)
        tok, lp = sample_tokens(logits, temp, top_k, top_p, row_keys(seeds, counts))
        return cache, tok, lp

    def _prefill_img(
        state,
        cache,
        ids,
        mask,
        positions,
        deltas,
        images,
        new_rows,
        temp,
        top_k,
        top_p,
        seeds,
        counts,
    ):
        cache = cache.replace(
            kv_mask=cache.kv_mask & ~new_rows[:, None],
            positions=jnp.where(new_rows, 0, cache.positions),
        )
        cache, logits = prefill_images(
            nnx.merge(graphdef, state), cache, ids, mask, positions, deltas, images
        )
        tok, lp = sample_tokens(logits, temp, top_k, top_p, row_keys(seeds, counts))
        return cache, tok, lp

    return (
        jax.jit(_prefill, donate_argnums=(1,)),
        jax.jit(_decode, donate_argnums=(1,)),
        jax.jit(_prefill_img, donate_argnums=(1,)),
    )


def _bucket(n: int, lo: int = 16) -> int:
    b = lo
    while b < n:
        b *= 2
    return b


class JAXSampler:
    """Sampler over a Flax ``Transformer`` (see the module docstring).

    Args:
        model: the ``Transformer`` (its params are the initial weights, version 0).
        tokenizer: an HF tokenizer, needed only for stop strings.
        eos_token_ids: ids that end a completion (default: the model config's eos).
        max_model_len: longest prompt + completion of one request.
        cache_len: KV slots shared by the batch (default ``2 * max_model_len``).
        partial_rollouts: at a weight sync, stop the rows in flight and continue them from
            their prefix with the new weights (see the module docstring).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        eos_token_ids: Sequence[int] | None = None,
        max_model_len: int = 2048,
        max_batch_size: int = 64,
        cache_len: int | None = None,
        request_timeout_s: float = 600.0,
        batch_wait_s: float = 0.005,
        name: str = "jax",
        partial_rollouts: bool = PARTIAL_ROLLOUTS_DEFAULT,
    ) -> None:
        import jax
        from flax import nnx

        self.name = name
        self.config = model.config
        self.vocab_size = int(self.config.vocab_size)
        self.max_model_len = int(max_model_len)
        self.max_batch_size = int(max_batch_size)
        self.cache_len = int(cache_len or 2 * self.max_model_len)
        if self.cache_len < self.max_model_len:
            raise ValueError(
                f"cache_len={self.cache_len} must be >= max_model_len={self.max_model_len}"
            )
        self.tokenizer = tokenizer
        eos = (
            eos_token_ids
            if eos_token_ids is not None
            else getattr(self.config, "eos_token_id", None)
        )
        if eos is None:
            eos = ()
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else eos)
        self.request_timeout_s = float(request_timeout_s)
        self.batch_wait_s = float(batch_wait_s)
        self.version = 0
        self.partial_rollouts = bool(partial_rollouts)
        self._restart_rows = False  # a sync asked the loop to continue its rows from prefixes
        self.last_sync: dict = {}
        self._graphdef, self._state = nnx.split(model, nnx.Param)
        self._base_graphdef, self._model_cls = self._graphdef, type(model)
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._dead: BaseException | None = None
        self._closed = False
        self._inflight = 0
        self.steps = {"prefill": 0, "decode": 0}
        self._build_fns(jax, nnx)
        self._thread = threading.Thread(target=self._run, name=f"{name}-batcher", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(cls, path, dtype: str | None = None, **kwargs) -> JAXSampler:
        """Load an HF checkpoint directory (weights, tokenizer, eos ids from generation_config)."""
        from transformers import AutoTokenizer

        from verltool_jax.models.hf_io import load_hf

        model = load_hf(path, dtype=dtype)
        tok = AutoTokenizer.from_pretrained(path)
        if "eos_token_ids" not in kwargs:
            gc = Path(path) / "generation_config.json"
            eos = json.loads(gc.read_text()).get("eos_token_id") if gc.is_file() else None
            eos = tok.eos_token_id if eos is None else eos
            kwargs["eos_token_ids"] = [eos] if isinstance(eos, int) else (eos or [])
        return cls(model, tok, **kwargs)

    # ------------------------------------------------------------------ jitted kernels
    def _build_fns(self, jax, nnx) -> None:
        from verltool_jax.models.decode import init_cache

        self._init_cache = lambda: init_cache(self.config, self.max_batch_size, self.cache_len)
        self._fns = _kernels(self._graphdef)

    # ------------------------------------------------------------------ public API
    @property
    def load(self) -> int:
        return self._inflight

    @property
    def alive(self) -> bool:
        return self._dead is None and not self._closed and self._thread.is_alive()

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
        in order) need a vision-language model: the prefill runs the vision tower and the
        prompt with its M-RoPE positions, decoding goes on at ``text index + delta``.
        """
        images = list(images or [])
        if images:
            check_image_request(self.name, self.config, prompt_token_ids, images)
        if not self.alive:
            raise SamplerDeadError(
                f"{self.name}: the JAX sampler is "
                f"{'closed' if self._closed else f'dead ({self._dead!r})'}; "
                "create a new one"
            )
        prompt = [int(t) for t in prompt_token_ids]
        max_new = effective_max_tokens(prompt, params, self.max_model_len, self.vocab_size)
        if params.stop and self.tokenizer is None:
            raise SamplerRequestError(
                f"{self.name}: SamplingParams.stop needs a tokenizer; "
                "build the JAXSampler with tokenizer= (or from_pretrained)"
            )
        seed = params.seed if params.seed is not None else random.getrandbits(31)
        req = _Request(
            prompt,
            params,
            max_new,
            cf.Future(),
            self.version,
            int(seed) & 0x7FFFFFFF,
            StopState(
                params.stop,
                frozenset(params.stop_token_ids),
                self.eos_token_ids,
                max_new,
                self.tokenizer,
            ),
            images=images,
        )
        self._inflight += 1
        self._queue.put(req)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(req.future), self.request_timeout_s)
        except TimeoutError:
            req.future.cancel()
            raise SamplerTimeoutError(
                f"{self.name}: generate did not finish within "
                f"request_timeout_s={self.request_timeout_s} s"
            ) from None
        finally:
            self._inflight -= 1

    def update_weights(self, params: Any, version: int) -> None:
        """Swap in the trainer's params (``nnx.State`` of the ``Transformer``, or the model).
        ``models.lora.AdapterWeights`` are applied as they are: the sampler runs the
        model with its LoRA layers (``y = x W + s (x A) B``, the trainer's own forward),
        compiled once per adapter structure; nothing is merged or copied."""
        from flax import nnx

        from verltool_jax.models.lora import AdapterWeights

        t0 = time.perf_counter()
        graphdef, path = self._base_graphdef, "swap"
        if isinstance(params, nnx.Module):
            params = nnx.split(params, nnx.Param)[1]
        elif isinstance(params, AdapterWeights):
            graphdef, params, path = self._lora_graphdef(params.config), params.params, "adapter"
        fns = _kernels(graphdef)
        with self._lock:
            self._graphdef, self._fns, self._state = graphdef, fns, params
            self.version = int(version)
            self._restart_rows = self.partial_rollouts
        self.last_sync = {
            "sync_seconds": time.perf_counter() - t0,
            "version": self.version,
            "sync_path": path,
        }

    def _lora_graphdef(self, config: Any) -> Any:
        """The graph of this sampler's model with the adapters of ``config`` (no arrays)."""
        from flax import nnx

        from verltool_jax.models.lora import LORA_FIELDS

        if config.lora_rank <= 0:
            raise ValueError(f"{self.name}: AdapterWeights with lora_rank=0")
        # the sampler's own model (its dtype, no remat) with the trainer's adapters
        cfg = self.config.replace(**{f: getattr(config, f) for f in LORA_FIELDS})
        abstract = nnx.eval_shape(lambda: self._model_cls(cfg, nnx.Rngs(0)))
        return nnx.split(abstract, nnx.Param)[0]

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ batching loop
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # report, never hang the callers
            self._dead = e
            self._fail_all(SamplerDeadError(f"{self.name}: the JAX sampler loop crashed: {e!r}"))

    def _fail_all(self, err: BaseException) -> None:
        for r in getattr(self, "_rows", []):
            if r is not None and not r.future.done():
                r.future.set_exception(err)
        while True:
            try:
                r = self._queue.get_nowait()
            except queue.Empty:
                return
            if not r.future.done():
                r.future.set_exception(err)

    def _loop(self) -> None:
        B = self.max_batch_size
        self._rows: list[_Request | None] = [None] * B
        cache = self._init_cache()
        index = 0  # host copy of cache.index
        last_tok = np.zeros(B, np.int32)
        pending: list[_Request] = []
        while not self._closed:
            restarted = self._take_rows_for_restart()
            if restarted:  # partial rollouts: continue them from their prefixes, first
                pending = restarted + pending
                cache, index = self._init_cache(), 0
            active = [i for i, r in enumerate(self._rows) if r is not None]
            # drop requests whose callers gave up
            for i in active:
                req = self._rows[i]
                if req is not None and req.future.cancelled():
                    self._rows[i] = None
            active = [i for i, r in enumerate(self._rows) if r is not None]
            if not active and index > 0:
                cache, index = self._init_cache(), 0
            # collect waiting requests (block briefly when idle)
            try:
                if not active and not pending:
                    pending.append(self._queue.get(timeout=0.1))
                    time.sleep(self.batch_wait_s)
                while True:
                    pending.append(self._queue.get_nowait())
            except queue.Empty:
                pass
            pending = [r for r in pending if not r.future.cancelled()]
            admitted = self._admit(pending, active, index)
            if admitted:
                pending = [r for r in pending if all(r is not a for _, a in admitted)]
                cache, index, toks, lps, version = self._run_prefill(cache, index, admitted)
                self.steps["prefill"] += 1
                rows = [i for i, _ in admitted]
            elif active:
                cache, toks, lps, version = self._run_decode(cache, last_tok, active)
                index += 1
                self.steps["decode"] += 1
                rows = active
            else:
                continue
            for i in rows:
                r = self._rows[i]
                assert r is not None  # admitted and active rows hold their request
                t = int(toks[i])
                r.tokens.append(t)
                r.logprobs.append(float(lps[i]))
                r.versions.append(version)
                last_tok[i] = t
                done = r.stop.check(r.tokens)
                if done is not None:
                    self._finish(i, *done)

    def _take_rows_for_restart(self) -> list[_Request]:
        """After a weight sync with ``partial_rollouts``: free every row in flight and
        return its request (tokens, logprobs and versions so far kept), to be prefilled
        again from its prefix; [] otherwise."""
        with self._lock:
            if not self._restart_rows:
                return []
            self._restart_rows = False
        out = [r for r in self._rows if r is not None and not r.future.cancelled()]
        self._rows = [None] * self.max_batch_size
        return out

    def _admit(self, pending, active, index) -> list[tuple[int, _Request]]:
        """Pick waiting requests for free rows while the shared cache has room for all."""
        free = [i for i, r in enumerate(self._rows) if r is None]
        if not pending or not free:
            return []
        need = max([self._rows[i].remaining for i in active] + [0])
        chosen: list[tuple[int, _Request]] = []
        longest = 0
        for r in pending:
            if len(chosen) == len(free):
                break
            L = _bucket(max(longest, len(r.input_ids)))
            if index + min(L, self.cache_len) + max(need, r.remaining) > self.cache_len:
                if not active and not chosen:  # alone in an empty cache: always fits
                    pass
                else:
                    continue
            chosen.append((free[len(chosen)], r))
            longest = max(longest, len(r.input_ids))
            need = max(need, r.remaining)
        return chosen

    def _params(self):
        """``((prefill, decode, prefill_images), params, version)``: the kernels of the
        structure being served, its params and their version, read together (a sync may
        change all three)."""
        with self._lock:
            return self._fns, self._state, self.version

    def _sampling_arrays(self, rows, reqs):
        import jax.numpy as jnp

        B = self.max_batch_size
        temp = np.ones(B, np.float32)
        top_k = np.zeros(B, np.int32)
        top_p = np.ones(B, np.float32)
        seeds = np.zeros(B, np.uint32)
        counts = np.zeros(B, np.uint32)
        for i, r in zip(rows, reqs):
            temp[i] = r.params.temperature
            top_k[i] = max(r.params.top_k, 0)
            top_p[i] = r.params.top_p
            seeds[i] = r.seed
            counts[i] = len(r.tokens)
        return [jnp.asarray(a) for a in (temp, top_k, top_p, seeds, counts)]

    def _run_prefill(self, cache, index, admitted):
        import jax.numpy as jnp

        B = self.max_batch_size
        L = min(_bucket(max(len(r.input_ids) for _, r in admitted)), self.cache_len)
        if index + L > self.cache_len:  # only when the batch was empty
            cache, index = self._init_cache(), 0
        ids = np.zeros((B, L), np.int32)
        mask = np.zeros((B, L), np.int32)
        new_rows = np.zeros(B, bool)
        for i, r in admitted:
            n = len(r.input_ids)
            ids[i, L - n :] = r.input_ids  # left-padded: the last token ends the block
            mask[i, L - n :] = 1
            new_rows[i] = True
            self._rows[i] = r
        rows = [i for i, _ in admitted]
        arrays = self._sampling_arrays(rows, [r for _, r in admitted])
        fns, params, version = self._params()
        if any(r.images for _, r in admitted):
            extra = self._image_arrays(ids, mask, admitted)
            cache, tok, lp = fns[2](
                params,
                cache,
                jnp.asarray(ids),
                jnp.asarray(mask),
                *extra,
                jnp.asarray(new_rows),
                *arrays,
            )
        else:
            cache, tok, lp = fns[0](
                params,
                cache,
                jnp.asarray(ids),
                jnp.asarray(mask),
                jnp.asarray(new_rows),
                *arrays,
            )
        return cache, index + L, np.asarray(tok), np.asarray(lp), version

    def _image_arrays(self, ids, mask, admitted):
        """``(positions [B,L,3], deltas [B], ImageBatch)`` of a prefill block with images: the
        images of the admitted rows in row order (the placeholder order of the block)."""
        import jax.numpy as jnp

        from verltool_jax.models.image_inputs import stack_images
        from verltool_jax.models.vision import image_batch
        from verltool_jax.models.vision_language import mrope_positions

        imgs = [im for _, r in sorted(admitted, key=lambda x: x[0]) for im in r.images]
        pv, grid = stack_images(imgs)
        positions, deltas = mrope_positions(ids, mask, grid, self.config)
        images = image_batch(pv, grid, self.config.vision, bucket=True)
        return jnp.asarray(positions), jnp.asarray(deltas), images

    def _run_decode(self, cache, last_tok, active):
        import jax.numpy as jnp

        act = np.zeros(self.max_batch_size, bool)
        act[active] = True
        arrays = self._sampling_arrays(active, [self._rows[i] for i in active])
        fns, params, version = self._params()
        cache, tok, lp = fns[1](params, cache, jnp.asarray(last_tok), jnp.asarray(act), *arrays)
        return cache, np.asarray(tok), np.asarray(lp), version

    def _finish(
        self, i: int, reason: str, stop_string: str | None, stop_token_id: int | None
    ) -> None:
        r = self._rows[i]
        assert r is not None, f"{self.name}: finishing row {i}, which holds no request"
        self._rows[i] = None
        metrics = {
            "engine": self.name,
            "num_prompt_tokens": len(r.prompt),
            "policy_version_end": self.version,
        }
        if stop_token_id is not None:
            metrics["stop_token_id"] = stop_token_id
        partial = self.partial_rollouts and bool(r.versions)
        try:
            r.future.set_result(
                Completion(
                    token_ids=r.tokens,
                    logprobs=r.logprobs,
                    finish_reason=reason,
                    stop_string=stop_string,
                    policy_version=r.versions[0] if partial else r.version,
                    metrics=metrics,
                    token_versions=list(r.versions) if partial else None,
                )
            )
        except cf.InvalidStateError:  # the caller gave up (timeout) meanwhile
            pass
