"""``finish``: VerlTool's terminal tool, kept so ``--tools python_code,sql,finish`` (a
VerlTool command line) works. It claims no action: a trajectory ends only on the
request's explicit ``finish`` flag (answered ``("", done=True, valid=True)`` by the
server, which then frees the trajectory's state in every tool) or its ``is_last_step``;
an action that no tool parses is invalid (``done=False, valid=False``), never a silent
end. Under ``--compat verltool`` a server whose only tool is ``finish`` ends every
trajectory on any action, as VerlTool's does.
"""

from __future__ import annotations

from typing import Any

from tool_server.kit.base import BaseTool, Observation


class FinishTool(BaseTool):
    name = "finish"
    usage = (
        "Ends the trajectory when the request sets finish: true (it claims no "
        "action; an action no tool parses is invalid)."
    )

    def parse_action(self, action: str) -> tuple[Any, bool]:
        return None, False

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        return "", True, True
