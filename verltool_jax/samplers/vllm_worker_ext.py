"""Methods mixed into every vLLM worker (``worker_extension_cls``), run in the engine.

``verltool_load_shared`` gets a manifest (JSON text) of a
:class:`~verltool_jax.samplers.weight_sync.SharedWeightBuffer`, maps the shared-memory
buckets (torch tensors on them, zero-copy) and loads them in one of two ways:

* **in place** (the fast path): every entry goes straight into the model's existing
  parameter -- ``param.data.copy_`` for the ones the engine computes with as they are
  (embedding, norms, biases, and linear weights where the engine keeps them, e.g. on GPU);
  a linear layer whose weight the CPU backend has packed into its GEMM kernel's own format
  (vLLM's ``dispatch_cpu_unquantized_gemm`` drops ``layer.weight`` and keeps a oneDNN /
  SGL / zentorch handle) gets its kernel rebuilt from the shared memory by the layer's own
  ``process_weights_after_loading``, the step vLLM runs after loading a checkpoint. The
  sender already stacked q/k/v and gate/up as vLLM's fused ``qkv_proj`` / ``gate_up_proj``
  hold them (checked here against the model's ``packed_modules_mapping`` and the layer's
  ``output_sizes``), and sent Flax kernels in their ``[in, out]`` layout, which is the
  ``weight.t()`` the CPU GEMM packs from: nothing is assembled or transposed on the way.
  An engine that serves LoRA has wrapped its layers (``base_layer`` holds the original):
  merged weights go into the wrapped layers the same way.
* **reload** (the fallback): vLLM's layer-by-layer ``reload_weights`` with HF-named
  tensors (the model's own loader), used whenever the in-place plan does not cover an
  entry: a name the model does not have, another fusion, tensor parallelism, a quantized
  layer, a shape that differs. The reason comes back to the caller, which logs it.

The method returns ``{"path": "inplace" | "reload", "reason", "tensors", "repacked",
"seconds"}`` (in place also ``copy_seconds``, ``repack_seconds`` and the engine
process's CPU seconds during the repack, ``repack_cpu_seconds``).
Its arguments are strings, so a stock ``vllm serve`` reaches it through its dev ``POST
/collective_rpc`` route as well as an in-process engine through ``collective_rpc``.
``verltool_load_weights`` takes a :class:`~verltool_jax.samplers.weight_sync.WeightPayload`
as plain fields (any host) and uses the reload path. No restart, no disk.

Tied embeddings: the checkpoint has no ``lm_head.weight``; on CPU the LM head keeps its
own pre-packed GEMM copy of the embedding, which neither path's loading touches (the
sampler would score with the old embedding), so after the embedding changes the head's
``process_weights_after_loading`` is re-run.
"""

from __future__ import annotations

import time
from typing import Any


class NoInplacePath(Exception):
    """The in-place plan does not cover this payload (the message says why)."""


def _tp_size(module) -> int:
    return int(getattr(module, "tp_size", 1) or 1)


def inplace_plan(model, entries) -> tuple[list, list]:
    """``(copies, repacks)`` for loading ``entries`` (``SharedEntry``) into ``model`` in
    place: ``copies`` are ``(param, entry)`` (``param.data.copy_(entry.hf())``), ``repacks``
    ``(linear module, entry)`` (the layer's packed GEMM weight rebuilt from the entry).
    A copy's target is the parameter, or its leading rows for a padded vocabulary.
    Raises :class:`NoInplacePath` naming the first entry it cannot place."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    params = dict(model.named_parameters())
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    tied = _tied(model)
    # a model whose parameters are named other than the checkpoint's (vision-language
    # models: "model.layers." -> "language_model.model.layers.") says how in its mapper
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    copies, repacks = [], []
    for e in entries:
        name = mapper.map_name(e.name) if mapper is not None else e.name
        if name is None:
            raise NoInplacePath(f"{e.name}: the engine's model drops this checkpoint name")
        if name.rsplit(".", 2)[-2:] != e.name.rsplit(".", 2)[-2:]:
            raise NoInplacePath(f"{e.name}: the engine's model stacks it into {name}")
        layer = name.rpartition(".")[0].rpartition(".")[2]  # e.g. qkv_proj
        name = _unwrapped(name, params)
        if name not in params and name.rpartition(".")[0].endswith("lm_head") and tied:
            continue  # a tied checkpoint's copy of the embedding
        p = params.get(name)
        if p is None:
            raise NoInplacePath(f"{e.name}: the engine's model has no such parameter")
        mod_name, _, pname = name.rpartition(".")
        module = model.get_submodule(mod_name)
        if _tp_size(module) != 1:
            raise NoInplacePath(f"{e.name}: tensor parallel ({_tp_size(module)} shards)")
        if e.parts:
            got = [n.rpartition(".")[0].rpartition(".")[2] for n, _ in e.parts]
            if list(packed.get(layer, ())) != got:
                raise NoInplacePath(
                    f"{e.name}: the model fuses {layer} as "
                    f"{packed.get(layer)}, the payload as {got}"
                )
            sizes = getattr(module, "output_sizes", None)
            if sizes is not None and [int(s) for s in sizes] != [int(r) for _, r in e.parts]:
                raise NoInplacePath(
                    f"{e.name}: parts {[r for _, r in e.parts]} != the "
                    f"layer's output sizes {list(sizes)}"
                )
        if isinstance(module, LinearBase) and pname == "weight":
            if not isinstance(getattr(module, "quant_method", None), UnquantizedLinearMethod):
                raise NoInplacePath(
                    f"{e.name}: quantized layer ({type(module.quant_method).__name__})"
                )
            shape = (int(module.output_size_per_partition), int(module.input_size_per_partition))
            if tuple(e.shape) != shape:
                raise NoInplacePath(f"{e.name}: shape {tuple(e.shape)} != the layer's {shape}")
            if tuple(p.shape) == shape:
                copies.append((p, e))
            elif p.numel() == 0 and hasattr(module, "cpu_linear"):
                repacks.append((module, e))
            else:
                raise NoInplacePath(
                    f"{e.name}: the engine holds the weight as {tuple(p.shape)}, not {shape}"
                )
        elif tuple(p.shape) == tuple(e.shape):
            copies.append((p, e))
        elif _padded_rows(module, p, e):
            copies.append((p.data[: e.shape[0]], e))
        else:
            raise NoInplacePath(
                f"{e.name}: shape {tuple(e.shape)} != the engine's {tuple(p.shape)}"
            )
    return copies, repacks


def _unwrapped(name: str, params: dict) -> str:
    """``name``, or ``<module>.base_layer.<param>`` where an engine serving LoRA wrapped the
    module (vLLM's ``*WithLoRA`` layers keep the original layer, and its weights, as
    ``base_layer``): merged weights go into that layer as into an unwrapped one."""
    mod_name, _, pname = name.rpartition(".")
    inner = f"{mod_name}.base_layer.{pname}"
    return inner if name not in params and inner in params else name


def _padded_rows(module, param, entry) -> bool:
    """A vocabulary embedding / LM head that vLLM pads to a multiple of its padding size
    (rows past the vocabulary stay zero): the entry fills its leading rows."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    return (
        isinstance(module, VocabParallelEmbedding)
        and len(param.shape) == len(entry.shape)
        and int(param.shape[0]) >= int(entry.shape[0])
        and tuple(param.shape[1:]) == tuple(entry.shape[1:])
    )


def _repack(module, weight) -> None:
    """Rebuild a CPU linear layer's packed GEMM weight from ``weight`` ([out, in], any
    strides) with the layer's own ``process_weights_after_loading``; the layer keeps its
    parameter object (``weight`` is only read, never kept)."""
    import torch

    old = module.weight
    if weight.dtype != old.dtype:
        weight = weight.to(old.dtype)
    module.weight = torch.nn.Parameter(weight, requires_grad=False)
    try:
        module.quant_method.process_weights_after_loading(module)
    finally:
        new = module.weight
        if new.numel() == 0:
            module.weight = old  # the packed kernel is all the layer uses
        elif new.data_ptr() == weight.data_ptr():
            new.data = weight.clone()  # the layer computes with it: never alias the shm


def _lm_head(model):
    """The LM head of a causal LM (``model.lm_head``) or of a vision-language model's
    language model (``model.language_model.lm_head``), or None."""
    head = getattr(model, "lm_head", None)
    if head is None:
        head = getattr(getattr(model, "language_model", None), "lm_head", None)
    return head


def _tied(model) -> bool:
    cfg = getattr(model, "config", None)
    get_text_config = getattr(cfg, "get_text_config", None)
    text = get_text_config() if get_text_config is not None else cfg
    return bool(
        getattr(cfg, "tie_word_embeddings", False) or getattr(text, "tie_word_embeddings", False)
    )


def _head_needs_refresh(model, written_ptrs: set) -> bool:
    """The LM head keeps a packed GEMM copy of its weight (on CPU) and that weight (the
    embedding, if tied) was just written."""
    head = _lm_head(model)
    weight = getattr(head, "weight", None)
    return (
        weight is not None
        and getattr(head, "quant_method", None) is not None
        and hasattr(head, "cpu_linear")
        and weight.data_ptr() in written_ptrs
    )


def _refresh_head(model) -> None:
    head = _lm_head(model)
    head.quant_method.process_weights_after_loading(head)


class WeightSyncWorkerExtension:
    # vLLM mixes this class into its worker, which owns the model runner.
    model_runner: Any

    def _verltool_reload(self, weights) -> int:
        self.model_runner.reload_weights(weights_iterator=weights)
        model = self.model_runner.get_model()
        head = _lm_head(model)
        if head is not None and _tied(model) and any("embed_tokens" in n for n, _ in weights):
            method = getattr(head, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(head)
        return len(weights)

    def _verltool_inplace(self, entries) -> dict:
        import torch

        model = self.model_runner.get_model()
        copies, repacks = inplace_plan(model, entries)
        t0 = time.perf_counter()
        with torch.no_grad():
            for p, e in copies:
                p.data.copy_(e.hf())
            t1, c1 = time.perf_counter(), time.process_time()
            # one layer at a time on the engine's own threads (layers side by side on
            # single-threaded workers measured no faster in the engine)
            for module, e in repacks:
                _repack(module, e.hf())
            head = _head_needs_refresh(model, {p.data_ptr() for p, _ in copies})
            if head:
                _refresh_head(model)
        t2, c2 = time.perf_counter(), time.process_time()
        # what GPUModelRunner.reload_weights resets after a reload
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(self.model_runner, reset, None)
            if fn is not None:
                fn()
        return {
            "tensors": len(copies) + len(repacks),
            "repacked": len(repacks) + int(head),
            "copy_seconds": t1 - t0,
            "repack_seconds": t2 - t1,
            "repack_cpu_seconds": c2 - c1,
        }

    def verltool_load_weights(self, names, dtypes, shapes, buffers) -> int:
        from verltool_jax.samplers.weight_sync import payload_to_torch

        return self._verltool_reload(list(payload_to_torch(names, dtypes, shapes, buffers)))

    def verltool_load_shared(self, manifest: str, mode: str = "auto") -> dict:
        """Load a shared-memory manifest: ``mode`` "auto" (in place, else reload),
        "inplace" (raise if it does not apply) or "reload" (vLLM's loader only)."""
        from verltool_jax.samplers.weight_sync import open_shared_entries

        if mode not in ("auto", "inplace", "reload"):
            raise ValueError(f"mode must be auto | inplace | reload, got {mode!r}")
        t0 = time.perf_counter()
        cache = self.__dict__.setdefault("_verltool_shm", {})
        entries = open_shared_entries(manifest, cache)
        reason = "mode=reload"
        if mode != "reload":
            try:
                out = self._verltool_inplace(entries)
                return {
                    "path": "inplace",
                    "reason": None,
                    **out,
                    "seconds": time.perf_counter() - t0,
                }
            except NoInplacePath as e:
                if mode == "inplace":
                    raise
                reason = str(e)
        weights = [nt for e in entries for nt in e.hf_tensors()]
        n = self._verltool_reload(weights)
        return {
            "path": "reload",
            "reason": reason,
            "tensors": n,
            "repacked": 0,
            "seconds": time.perf_counter() - t0,
        }

    def verltool_load_lora(self, name: str, lora_id: int, path: str) -> dict:
        """Replace the adapter ``lora_id`` in place with the PEFT directory ``path`` (vLLM's
        ``add_lora`` with ``load_inplace``: the new one is loaded, the old one removed, the
        same slot reused). Plain arguments, so it crosses any RPC; returns what
        ``verltool_load_shared`` does, with ``path="adapter"`` and ``adapters``, the
        number the engine holds afterwards (1: nothing accumulates)."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        req = LoRARequest(lora_name=name, lora_int_id=int(lora_id), lora_path=path)
        req.load_inplace = True
        self.model_runner.add_lora(req)
        return {
            "path": "adapter",
            "reason": None,
            "adapters": len(self.model_runner.list_loras()),
            "seconds": time.perf_counter() - t0,
        }
