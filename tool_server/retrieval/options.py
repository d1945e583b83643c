"""The tool options that select and tune a retrieval service (shared by the tools that
search a local index: ``search_retrieval`` and the local ``web_search`` backend).

``--tool-opt`` keys (environment fallback in brackets):
``retrieval_index`` [VERLTOOL_RETRIEVAL_INDEX] the index folder;
``retrieval_encoder`` [VERLTOOL_RETRIEVAL_ENCODER] a sentence-transformers folder for
dense queries (default: the one the index was built with);
``retrieval_batch_ms`` (5) how long a batch waits for more queries;
``retrieval_max_batch`` (64) the largest batch;
``retrieval_torch_threads`` (torch's default) intra-op threads of the dense query encoder
(process-wide; 1 avoids thread barriers on a busy machine, see
``benchmarks/search_tools_throughput.py --torch-threads``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tool_server.kit.options import tool_option

from .service import RetrievalService, get_service


class RetrievalNotConfigured(RuntimeError):
    pass


@dataclass(frozen=True)
class RetrievalOptions:
    index_dir: str | None
    encoder: str | None = None
    batch_ms: float = 5.0
    max_batch: int = 64
    torch_threads: int | None = None

    @classmethod
    def from_extra(cls, extra: dict | None) -> RetrievalOptions:
        return cls(
            index_dir=tool_option(
                extra, "retrieval_index", str, None, env="VERLTOOL_RETRIEVAL_INDEX"
            ),
            encoder=tool_option(
                extra, "retrieval_encoder", str, None, env="VERLTOOL_RETRIEVAL_ENCODER"
            ),
            batch_ms=tool_option(extra, "retrieval_batch_ms", float, 5.0, minimum=0),
            max_batch=tool_option(extra, "retrieval_max_batch", int, 64, minimum=1),
            torch_threads=tool_option(extra, "retrieval_torch_threads", int, None, minimum=1),
        )

    def service(self) -> RetrievalService:
        """The shared service of this index (opened on first use; errors say what to fix)."""
        if not self.index_dir:
            raise RetrievalNotConfigured(
                "no retrieval index is configured; start the tool server with "
                "--tool-opt retrieval_index=<index folder> (or set VERLTOOL_RETRIEVAL_INDEX); "
                "build one with `python -m tool_server.retrieval build`"
            )
        if self.torch_threads:
            import torch

            if torch.get_num_threads() != self.torch_threads:
                torch.set_num_threads(self.torch_threads)
        return get_service(self.index_dir, self.encoder, self.batch_ms, self.max_batch)

    async def warm_up(self) -> None:
        """Open the index (in a thread: loading blocks) and run one query, so the first
        real request does not pay for loading the encoder. Raises what opening raises."""
        if not self.index_dir:
            return
        service = await asyncio.get_running_loop().run_in_executor(None, self.service)
        await service.search("warm up", 1)
