"""Answer formats: ``native`` (this server's own) or ``verltool`` (VerlTool's server).

The wire protocol is the same in both; what differs is the observations, dones and valids
a client gets back. ``--compat verltool`` makes the server answer as VerlTool's
``verl_tool/servers/tool_server.py`` does, so VerlTool's agent loop and scripts see the
same bytes from ``python_code``, ``sql``, ``search_retrieval`` and ``finish``:

* routing skips ``finish``: only the explicit ``finish`` flag (request list or
  ``extra_fields[i]["finish"]``) ends a trajectory, with ``("", done=True, valid=True)``;
* an action no tool parses gets :func:`verltool_invalid_observation` (``done=False,
  valid=False``);
* observations are not cut to ``--max-obs-length`` (VerlTool's server does not cut;
  its tools do, each as VerlTool's tool does);
* each tool formats its observation as VerlTool's tool of the same name.

A tool reads its mode with :func:`tool_compat`: the option ``<tool name>_compat``
(``--tool-opt sql_compat=native``) overrides the server-wide ``--compat`` for that tool.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tool_server.kit.options import tool_option

if TYPE_CHECKING:
    from tool_server.kit.base import BaseTool, ToolSettings

NATIVE = "native"
VERLTOOL = "verltool"
COMPAT_MODES = (NATIVE, VERLTOOL)

# VerlTool's answer to an action that no tool parses.
VERLTOOL_INVALID_REASON = "No valid tool found for action"
VERLTOOL_NO_USAGE = "No tools available for usage instructions."


def check_compat(value: str, where: str = "--compat") -> str:
    """``value`` if it is a known mode, else ValueError naming ``where`` and the choices."""
    if value not in COMPAT_MODES:
        raise ValueError(f"{where} must be one of {', '.join(COMPAT_MODES)}, got {value!r}")
    return value


def tool_compat(settings: ToolSettings, tool_name: str) -> str:
    """The mode of one tool: option ``<tool_name>_compat``, else ``settings.compat``."""
    key = f"{tool_name}_compat"
    value = tool_option(settings.extra, key, str, settings.compat)
    return check_compat(value, f"--tool-opt {key}")


def verltool_usage_block(tools: Iterable[BaseTool]) -> str:
    """VerlTool's ``available_tools`` text: ``"Available tools:"`` then one line
    ``"• {name}: {usage}"`` per tool other than ``finish`` (in routing order), or
    :data:`VERLTOOL_NO_USAGE` when there is none. A tool's usage is its
    ``verltool_usage`` (VerlTool's text for the tool of that name), else ``usage``."""
    lines = [
        f"• {t.name}: {t.verltool_usage if t.verltool_usage is not None else t.usage}"
        for t in tools
        if t.name != "finish"
    ]
    return "\n".join(["Available tools:", *lines]) if lines else VERLTOOL_NO_USAGE


def verltool_invalid_observation(usage_block: str) -> dict:
    """VerlTool's observation for an action no tool parses (sent with done=False,
    valid=False): ``{"obs": "", "invalid_reason": ..., "available_tools": usage_block}``."""
    return {"obs": "", "invalid_reason": VERLTOOL_INVALID_REASON, "available_tools": usage_block}
