"""``finish``: VerlTool's terminal tool. It accepts ANY action, so list it last in
``--tools`` (``--tools python_code,sql,finish``): an action that no earlier tool claims
(the model's final answer) ends the trajectory with ``("", done=True, valid=True)``, and
the server then frees the trajectory's state in every tool.

Without ``finish`` in ``--tools`` such an action is invalid instead; a client can
always end a trajectory explicitly with the request's ``finish: [true]`` flag.
"""
from __future__ import annotations

from typing import Any

from tool_server.kit.base import BaseTool, Observation


class FinishTool(BaseTool):
    name = "finish"
    usage = "Any action no other tool handles ends the trajectory (list this tool last)."

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return action, True

    async def conduct_action(self, trajectory_id: str, parsed: Any, extra_field: dict
                             ) -> tuple[Observation, bool, bool]:
        return "", True, True
