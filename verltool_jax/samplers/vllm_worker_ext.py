"""Methods mixed into every vLLM worker (``worker_extension_cls``), run in the engine.

``verltool_load_shared`` gets a manifest (JSON text) of a
:class:`~verltool_jax.samplers.weight_sync.SharedWeightBuffer`: it maps the shared-memory
buckets, builds torch tensors on them (zero-copy) and reloads them in place with vLLM's
own ``reload_weights`` (the model's HF-name loader: fused qkv / gate_up). Its only
argument is a string, so a stock ``vllm serve`` reaches it through its dev
``POST /collective_rpc`` route as well as an in-process engine through
``collective_rpc``. ``verltool_load_weights`` takes a
:class:`~verltool_jax.samplers.weight_sync.WeightPayload` as plain fields (any host).
No restart, no disk.

Tied embeddings: the checkpoint has no ``lm_head.weight``, so vLLM's layer-wise reload
never re-processes the LM head; on CPU its ``process_weights_after_loading`` keeps a
pre-packed GEMM copy of the weight, which would stay stale (the sampler would score
with the old embedding). We re-run that step for a tied head after every reload.
"""
from __future__ import annotations


class WeightSyncWorkerExtension:
    def _verltool_reload(self, weights) -> int:
        self.model_runner.reload_weights(weights_iterator=weights)
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        if (head is not None and getattr(model.config, "tie_word_embeddings", False)
                and any("embed_tokens" in n for n, _ in weights)):
            method = getattr(head, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(head)
        return len(weights)

    def verltool_load_weights(self, names, dtypes, shapes, buffers) -> int:
        from verltool_jax.samplers.weight_sync import payload_to_torch
        return self._verltool_reload(list(payload_to_torch(names, dtypes, shapes, buffers)))

    def verltool_load_shared(self, manifest: str) -> int:
        from verltool_jax.samplers.weight_sync import open_shared_tensors
        cache = self.__dict__.setdefault("_verltool_shm", {})
        return self._verltool_reload(list(open_shared_tensors(manifest, cache)))
