"""Micro-batching of concurrent requests.

Callers ``await batcher.submit(item)``; the first item of a batch starts a timer of
``max_wait_ms``; when it fires (or ``max_batch`` items are waiting) the whole batch goes
to ``fn(items) -> results`` in one worker thread, and each caller gets its own result
(or the batch's exception). One worker thread means ``fn`` never runs concurrently with
itself, so it may use non-thread-safe state (a model, a FAISS index).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class AsyncBatcher(Generic[T, R]):
    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        max_wait_ms: float = 5.0,
        max_batch: int = 64,
        name: str = "batcher",
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self._fn = fn
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_batch = max_batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._pending: list[tuple[T, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()  # running batches (a task needs a reference)
        # Sizes of the most recent batches (for metrics and tests).
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=1024)

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._pending.append((item, fut))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush)
        return await fut

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[T, asyncio.Future]]) -> None:
        items = [item for item, _ in batch]
        self.batch_sizes.append(len(items))
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, self._fn, items)
            if len(results) != len(items):
                raise RuntimeError(
                    f"batched function returned {len(results)} results for {len(items)} items"
                )
        except BaseException as e:  # every waiter learns of the failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), res in zip(batch, results):
            if not fut.done():
                fut.set_result(res)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
