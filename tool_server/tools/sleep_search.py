"""``sleep_search``: a stand-in search tool with heavy-tailed latency, for experiments.

It answers ``<search>query</search>`` with a fixed fake passage after sleeping for a
latency drawn from a lognormal distribution with mean ``sleep_search_mean_s`` (1 s) and
log standard deviation ``sleep_search_sigma`` (0.8):
``latency = mean_s * exp(sigma * z - sigma^2 / 2)``, ``z ~ N(0, 1)``. The draw is a pure
function of ``(sleep_search_seed, trajectory_id, call index)``, so the synchronous and
asynchronous runs of an ablation see the same latencies. Options come through
``--tool-opt`` (``ToolSettings.extra``). Not a retrieval tool: no real documents.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from typing import Any

from tool_server.kit.base import BaseTool, Observation, ToolSettings
from tool_server.kit.options import tool_option
from tool_server.kit.search import parse_query_action


def lognormal_latency(
    mean_s: float, sigma: float, seed: int, trajectory_id: str, call_index: int
) -> float:
    """``mean_s * exp(sigma * z - sigma^2 / 2)`` with ``z`` seeded by the call's identity."""
    h = hashlib.sha256(f"{seed}:{trajectory_id}:{call_index}".encode()).digest()
    z = random.Random(int.from_bytes(h[:8], "little")).gauss(0.0, 1.0)
    return mean_s * math.exp(sigma * z - sigma * sigma / 2.0)


class SleepSearchTool(BaseTool):
    name = "sleep_search"
    usage = "<search>query</search> (experiments only: sleeps, then returns a fake passage)"

    def __init__(self, settings: ToolSettings | None = None) -> None:
        super().__init__(settings)
        extra = self.settings.extra
        self.mean_s: float = tool_option(extra, "sleep_search_mean_s", float, 1.0, minimum=0.0)
        self.sigma: float = tool_option(extra, "sleep_search_sigma", float, 0.8, minimum=0.0)
        self.seed: int = tool_option(extra, "sleep_search_seed", int, 0)

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return parse_query_action(action, "search")

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        env = self.load_env(trajectory_id)
        k = env.get("calls", 0)
        env["calls"] = k + 1
        self.save_env(trajectory_id, env)
        lat = lognormal_latency(self.mean_s, self.sigma, self.seed, trajectory_id, k)
        await asyncio.sleep(lat)
        return (
            {"obs": f"Doc 1: results for '{parsed[:64]}'.", "metrics": {"latency_s": lat}},
            False,
            True,
        )
