"""SFT demonstrations whose observations come from the tool server itself.

A task proposes, per training row, one tool call the model should make and a rule for
its final answer given what the tool says (:class:`Proposal`). :func:`demonstrate` sends
the calls to the tool server the run would use (``tool_server.url``, else one started with
the run's tools and options, exactly as training starts it), in batches, with each row's
``extra_field`` as the rollout sends it, and keeps the rows whose call was valid and whose
rule accepts the observation::

    response_segments = [{"text": action, "loss": True},
                         {"text": observation, "loss": False, "observation": True},
                         {"text": final, "loss": True}]

The observation segment holds the tool's raw answer; SFT tokenizes it with the rollout's
observation formatter (template and truncation, :mod:`verltool_jax.data.sft`), so a
demonstration is token for token a trajectory the policy could have produced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Proposal:
    """One candidate demonstration: the data row, the tool call, and ``final(observation)``
    -> the text the model ends with, or None to drop the candidate."""

    row: dict
    action: str
    final: Callable[[str], str | None]


def segments(action: str, observation: str, final: str) -> list[dict]:
    """The ``response_segments`` of a one-call demonstration (see the module doc)."""
    return [
        {"text": action, "loss": True},
        {"text": observation, "loss": False, "observation": True},
        {"text": final, "loss": True},
    ]


def demonstrate(
    run_config: Any, proposals: Sequence[Proposal], limit: int, batch_size: int = 64
) -> list[dict]:
    """Up to ``limit`` SFT rows from ``proposals`` (in order; see the module doc). Calls
    stop once ``limit`` rows are kept. Raises ValueError when none is kept."""
    from tool_server.client import ToolClient
    from tool_server.launcher import serve_tools
    from verltool_jax.rollout.turns import row_extra_field

    if limit < 1:
        raise ValueError(f"demonstrations: limit must be >= 1, got {limit}")
    rc = run_config
    kept: list[dict] = []
    seen = dropped = 0

    async def go(url: str) -> None:
        nonlocal seen, dropped
        async with ToolClient(url, timeout_s=rc.tool_server.timeout_s + 30) as client:
            for start in range(0, len(proposals), batch_size):
                chunk = proposals[start : start + batch_size]
                ids = [f"demo-{start + i}" for i in range(len(chunk))]
                results = await client.get_observations(
                    ids, [p.action for p in chunk], [row_extra_field(p.row) for p in chunk]
                )
                await client.finish(ids)
                for p, res in zip(chunk, results):
                    seen += 1
                    final = p.final(res.observation) if res.valid and not res.timed_out else None
                    if final is None:
                        dropped += 1
                        continue
                    kept.append(
                        {**p.row, "response_segments": segments(p.action, res.observation, final)}
                    )
                    if len(kept) >= limit:
                        return

    with serve_tools(rc.tool_server) as (url, _):
        asyncio.run(go(url))
    log.info("demonstrations: %d kept of %d tool calls (%d dropped)", len(kept), seen, dropped)
    if not kept:
        raise ValueError(
            f"no SFT demonstration: none of the {seen} proposed tool calls gave "
            "an observation the task could answer from; set task.num_demos=0"
        )
    return kept
