"""Methods mixed into every vLLM worker (``worker_extension_cls``), run in the engine.

``verltool_load_weights`` receives a :class:`~verltool_jax.samplers.weight_sync.WeightPayload`
as plain fields (msgpack-safe), rebuilds torch tensors and reloads them in place with
vLLM's own ``reload_weights`` (the model's HF-name loader: fused qkv / gate_up, tied
embeddings). No restart, no disk.
"""
from __future__ import annotations


class WeightSyncWorkerExtension:
    def verltool_load_weights(self, names, dtypes, shapes, buffers) -> int:
        from verltool_jax.samplers.weight_sync import payload_to_torch
        weights = list(payload_to_torch(names, dtypes, shapes, buffers))
        self.model_runner.reload_weights(weights_iterator=weights)
        return len(weights)
