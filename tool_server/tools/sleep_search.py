"""``sleep_search``: a stand-in search tool with heavy-tailed latency, for experiments.

It answers ``<search>query</search>`` with a fixed fake passage after sleeping for a
latency drawn from a lognormal distribution with mean ``mean_s`` (default 1 s) and log
standard deviation ``sigma`` (default 0.8): ``latency = mean_s * exp(sigma * z - sigma^2/2)``,
``z ~ N(0, 1)``. The draw is a pure function of ``(seed, trajectory_id, call index)``, so
the synchronous and asynchronous runs of an ablation see the same latencies. Options
(``ToolSettings.extra``): ``sleep_search_mean_s``, ``sleep_search_sigma``,
``sleep_search_seed``. Not a retrieval tool: it returns no real documents.
"""
from __future__ import annotations

import asyncio
import hashlib
import math
import random
import re

from tool_server.tools.base import BaseTool

_SEARCH_RE = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def lognormal_latency(mean_s: float, sigma: float, seed: int, trajectory_id: str,
                      call_index: int) -> float:
    """``mean_s * exp(sigma * z - sigma^2 / 2)`` with ``z`` seeded by the call's identity."""
    h = hashlib.sha256(f"{seed}:{trajectory_id}:{call_index}".encode()).digest()
    z = random.Random(int.from_bytes(h[:8], "little")).gauss(0.0, 1.0)
    return mean_s * math.exp(sigma * z - sigma * sigma / 2.0)


class SleepSearchTool(BaseTool):
    name = "sleep_search"
    usage = "<search>query</search> (experiments only: sleeps, then returns a fake passage)"

    def parse_action(self, action: str):
        m = _SEARCH_RE.findall(action or "")
        return (m[-1].strip(), True) if m else (None, False)

    async def conduct_action(self, trajectory_id, parsed, extra_field):
        ex = self.settings.extra
        env = self.load_env(trajectory_id)
        k = env.get("calls", 0)
        env["calls"] = k + 1
        self.save_env(trajectory_id, env)
        lat = lognormal_latency(float(ex.get("sleep_search_mean_s", 1.0)),
                                float(ex.get("sleep_search_sigma", 0.8)),
                                int(ex.get("sleep_search_seed", 0)), trajectory_id, k)
        await asyncio.sleep(lat)
        obs = {"obs": f"Doc 1: results for '{parsed[:64]}'.", "metrics": {"latency_s": lat}}
        return obs, False, True
