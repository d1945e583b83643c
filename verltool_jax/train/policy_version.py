"""The one owner of the policy version.

Version ``v`` is the policy after ``v`` optimizer steps of RL (``TrainState.step``).
:class:`PolicyPublisher` is the only code that moves it: :meth:`publish` pushes the
trainer's parameters to the sampler(s) (every engine of a pool) and then tells the
trajectory queue (given at construction), so a group is never labelled with a version
its sampler did not serve. :attr:`version` is a host integer: reading it never waits for
the device.
Every push is measured: :meth:`sync_metrics` gives the bytes (the payload per engine, as
the sampler reports it in ``last_sync["sync_bytes"]``) and wall seconds of the last one,
and whether it carried the LoRA adapters only.

With LoRA the trainer publishes ``models.lora.AdapterWeights`` (base + adapters):
``lora_sync="adapter"`` hands them to the samplers as they are (each applies the adapters
itself, or merges them if it cannot); ``"merged"`` folds them into the kernels first, so
every sampler gets the whole merged model (``sampler.lora_sync``, its "auto" resolved by
``train.build.lora_sync_mode``), unless the sampler says it ``merges_adapters`` itself
(a vLLM engine without LoRA layers: it folds them and knows the frozen base unchanged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from verltool_jax.rollout.queue import TrajectoryQueue

log = logging.getLogger("verltool_jax.train")


class PolicyPublisher:
    """Moves sampler(s) and queue to a new policy version together."""

    def __init__(
        self, sampler: Any, queue: TrajectoryQueue | None = None, lora_sync: str = "adapter"
    ):
        if lora_sync not in ("adapter", "merged"):
            raise ValueError(
                f"lora_sync must be adapter | merged, got {lora_sync!r} "
                "(train.build.lora_sync_mode resolves sampler.lora_sync='auto')"
            )
        self.sampler = sampler
        self.queue = queue
        self.lora_sync = lora_sync
        self.last_sync_adapter = False
        self.version: int | None = None
        self.last_sync_s = 0.0
        self.last_sync_bytes = 0
        self.syncs = 0

    def publish_now(self, params: Any, version: int) -> None:
        """Synchronous push at start-up, before the event loop runs; the queue, if any,
        must have been made at ``version`` (later pushes move it: use :meth:`publish`)."""
        if self.queue is not None and self.queue.version != version:
            raise RuntimeError(
                f"publish_now({version}) with a queue at version {self.queue.version}: "
                "it is for start-up; later versions go through publish()"
            )
        self._push(params, version)

    async def publish(self, params: Any, version: int) -> float:
        """Push ``params`` as ``version`` to the sampler(s), then the queue; returns the
        seconds the weight transfer took (it runs in a worker thread)."""
        await asyncio.to_thread(self._push, params, version)
        if self.queue is not None:
            await self.queue.set_version(version)
        return self.last_sync_s

    def _push(self, params: Any, version: int) -> None:
        if self.version is not None and version < self.version:
            raise ValueError(f"policy version may not go back: {self.version} -> {version}")
        from verltool_jax.models.lora import AdapterWeights

        t0 = time.perf_counter()
        merges = getattr(self.sampler, "merges_adapters", False)
        if isinstance(params, AdapterWeights) and self.lora_sync == "merged" and not merges:
            params = params.merged()
        self.sampler.update_weights(params, version)
        self.last_sync_s = time.perf_counter() - t0
        last = getattr(self.sampler, "last_sync", {})
        self.last_sync_bytes = int(last.get("sync_bytes", 0))
        self.last_sync_adapter = last.get("sync_path") == "adapter"
        self.syncs += 1
        self.version = version
        log.info(
            "weight sync %d -> version %d: %.1f MB in %.3f s (%.2f GB/s)",
            self.syncs,
            version,
            self.last_sync_bytes / 1e6,
            self.last_sync_s,
            self.last_sync_bytes / max(self.last_sync_s, 1e-9) / 1e9,
        )

    def sync_metrics(self) -> dict:
        """Bytes, seconds, GB/s of the last push and whether it was adapter-only
        (``metric_names.SYNC_*``)."""
        from verltool_jax import metric_names as names

        return {
            names.SYNC_BYTES: float(self.last_sync_bytes),
            names.SYNC_SECONDS: self.last_sync_s,
            names.SYNC_GBPS: self.last_sync_bytes / max(self.last_sync_s, 1e-9) / 1e9,
            names.SYNC_ADAPTER_ONLY: float(self.last_sync_adapter),
        }
