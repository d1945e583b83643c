"""A pool of samplers (one per device group) behind the same :class:`Sampler` protocol.

``generate`` routes with :class:`~verltool_jax.samplers.routing.StickyLeastLoadedRouter`
(``request_id`` = the trajectory id, so all turns of a trajectory reuse one engine's
prefix cache); a sampler that reports itself dead (:class:`SamplerDeadError`) is taken
out of rotation and the request retried on another. ``update_weights`` pushes the same
weights to every sampler, concurrently, and records the version.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .base import Completion, Sampler, SamplerDeadError, SamplerError, SamplingParams
from .routing import StickyLeastLoadedRouter


class SamplerPool:
    def __init__(self, samplers: Sequence[Sampler], max_sticky_keys: int = 100_000) -> None:
        self.samplers = list(samplers)
        if not self.samplers:
            raise ValueError("SamplerPool needs at least one sampler")
        self.router = StickyLeastLoadedRouter(len(self.samplers), max_sticky_keys)
        self.inflight = [0] * len(self.samplers)
        self.healthy = [True] * len(self.samplers)
        self.version = min(int(getattr(s, "version", 0)) for s in self.samplers)
        self.last_sync: dict = {}

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> Completion:
        """Route to a sampler (sticky per ``request_id``, else least loaded) and sample;
        ``images`` (vision-language policies) go with the request."""
        kw = {"images": list(images)} if images else {}
        last: BaseException | None = None
        for _ in range(len(self.samplers)):
            try:
                idx = self.router.choose(request_id, self.inflight, self.healthy)
            except RuntimeError as e:
                raise SamplerDeadError(
                    f"every sampler in the pool is dead ({last}); restart the pool"
                ) from last or e
            self.inflight[idx] += 1
            try:
                c = await self.samplers[idx].generate(prompt_token_ids, params, request_id, **kw)
            except SamplerDeadError as e:
                last = e
                self.healthy[idx] = False
                self.router.forget_sampler(idx)
                continue
            finally:
                self.inflight[idx] -= 1
            c.metrics["sampler_index"] = idx
            return c
        raise SamplerDeadError(f"every sampler in the pool is dead ({last}); restart the pool")

    def release(self, request_id: str) -> None:
        """The trajectory finished: forget its sticky assignment."""
        self.router.release(request_id)

    def update_weights(self, params: Any, version: int) -> None:
        """Push ``params`` to every live sampler (concurrently) as ``version``."""
        t0 = time.perf_counter()
        live = [s for s, ok in zip(self.samplers, self.healthy) if ok]
        if len(live) == 1:
            live[0].update_weights(params, version)
        else:
            with ThreadPoolExecutor(len(live)) as ex:
                for f in [ex.submit(s.update_weights, params, version) for s in live]:
                    f.result()
        self.version = int(version)
        per = [getattr(s, "last_sync", {}) or {} for s in live]
        self.last_sync = {
            "version": self.version,
            "samplers": len(live),
            "sync_seconds": time.perf_counter() - t0,
            "sync_bytes": max((int(p.get("sync_bytes", 0)) for p in per), default=0),
            "sync_bytes_total": sum(int(p.get("sync_bytes", 0)) for p in per),
        }
        paths = {p.get("sync_path") for p in per}
        if len(paths) == 1:  # e.g. "adapter" when every engine took the adapters only
            self.last_sync["sync_path"] = paths.pop()

    @property
    def merges_adapters(self) -> bool:
        """Every engine serves ``AdapterWeights`` merged itself (``VLLMSampler``)."""
        return all(getattr(s, "merges_adapters", False) for s in self.samplers)

    @property
    def load(self) -> int:
        return sum(self.inflight)

    def close(self) -> None:
        errors = []
        for s in self.samplers:
            try:
                s.close()
            except Exception as e:  # close every one, then report
                errors.append(e)
        if errors:
            raise SamplerError(f"closing the pool: {errors}")
