"""Methods mixed into every vLLM worker (``worker_extension_cls``), run in the engine.

``verltool_load_weights`` receives a :class:`~verltool_jax.samplers.weight_sync.WeightPayload`
as plain fields (msgpack-safe), rebuilds torch tensors and reloads them in place with
vLLM's own ``reload_weights`` (the model's HF-name loader: fused qkv / gate_up). No
restart, no disk.

Tied embeddings: the checkpoint has no ``lm_head.weight``, so vLLM's layer-wise reload
never re-processes the LM head; on CPU its ``process_weights_after_loading`` keeps a
pre-packed GEMM copy of the weight, which would stay stale (the sampler would score
with the old embedding). We re-run that step for a tied head after every reload.
"""
from __future__ import annotations


class WeightSyncWorkerExtension:
    def verltool_load_weights(self, names, dtypes, shapes, buffers) -> int:
        from verltool_jax.samplers.weight_sync import payload_to_torch
        weights = list(payload_to_torch(names, dtypes, shapes, buffers))
        self.model_runner.reload_weights(weights_iterator=weights)
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        if (head is not None and getattr(model.config, "tie_word_embeddings", False)
                and any("embed_tokens" in n for n in names)):
            method = getattr(head, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(head)
        return len(weights)
