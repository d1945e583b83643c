"""The tool plugin interface.

A tool is one Python file in ``tool_server/tools/`` that defines a subclass of
:class:`BaseTool` with a unique ``name``. The server discovers it by scanning that folder;
nothing else needs editing. See ``docs/adding_a_tool.md``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tool_server.kit.compat import NATIVE, VERLTOOL, tool_compat

# An observation is either a plain string or a dict with at least "obs": str and
# optionally "image" (data URL), "reward", "metrics", "invalid_reason".
Observation = str | dict
# What ``conduct_action`` gives back: ``(observation, done, valid)``.
ActionResult = tuple[Observation, bool, bool]


@dataclass
class ToolSettings:
    """Server-wide settings every tool sees (set from the command line)."""

    timeout_s: float = 10.0  # per-call wall-clock limit
    max_obs_chars: int = 8192  # observations longer than this are truncated
    state_ttl_s: float = 600.0  # idle per-trajectory state is freed after this
    unsafe_no_sandbox: bool = False  # run code without bubblewrap (loud warning)
    workdir: str = "/tmp/verltool_jax_tools"  # scratch root for sandboxes/workspaces
    extra: dict = field(default_factory=dict)  # tool-specific options ("--tool-opt k=v")
    # --- server-wide knobs (added with the server core; all have defaults) ---
    workers: int = 4  # sandboxed python worker processes (fork servers)
    max_concurrency: int = 256  # tool calls in flight, all tools together
    tool_max_concurrency: int = 64  # default per-tool bound (a tool's class attr wins)
    sweep_interval_s: float = 30.0  # how often idle trajectory state is swept
    tool_dirs: list = field(default_factory=list)  # extra folders scanned for tools
    compat: str = NATIVE  # answer format: native | verltool (tool_server.kit.compat)
    # --- request limits (HTTP) ---
    max_request_mb: float = 64.0  # larger request bodies get HTTP 413
    max_batch: int = 4096  # more actions in one request get HTTP 422
    client_timeout_s: float = 60.0  # a client that takes longer to send a request is cut off


class BaseTool:
    """Base class of every tool.

    Subclasses set ``name`` and ``usage`` and implement :meth:`parse_action` and
    :meth:`conduct_action` (sync or ``async``). Per-trajectory state lives in
    ``self.env`` through :meth:`load_env`, :meth:`save_env` and :meth:`delete_env`;
    override :meth:`on_delete` to release external resources (processes, dirs).
    """

    name: ClassVar[str] = ""
    usage: str = ""  # a class attribute; a tool may set its own per instance (mcp)
    # Concurrency bound for this tool (None: only the server-wide bound applies).
    max_concurrency: ClassVar[int | None] = None
    # VerlTool's usage text for its tool of the same name (the invalid-action answer of
    # --compat verltool lists it); None: ``usage``.
    verltool_usage: ClassVar[str | None] = None
    # Native tool calling (docs/gateway.md): a tag tool names the tag its action is written
    # in (``call_tag``) and the one string argument that fills it (``call_arg``); any other
    # tool takes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and its
    # arguments are free-form unless ``call_parameters`` (a JSON Schema object) says more.
    call_tag: ClassVar[str | None] = None
    call_arg: ClassVar[str] = "input"
    call_parameters: ClassVar[dict | None] = None

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()
        self.env: dict[str, dict] = {}
        self._last_used: dict[str, float] = {}
        # answer format of this tool: "native" or "verltool" (see tool_server.kit.compat)
        self.compat: str = tool_compat(self.settings, self.name)

    # --- the plugin contract -------------------------------------------------------
    def function_schema(self) -> dict:
        """This tool as an OpenAI ``tools`` entry (the chat template's ``tools=``): its name,
        ``usage`` as the description, and the JSON Schema of its arguments."""
        if self.call_tag is not None:
            params: dict = {
                "type": "object",
                "properties": {self.call_arg: {"type": "string"}},
                "required": [self.call_arg],
            }
        else:
            params = self.call_parameters or {"type": "object"}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.usage, "parameters": params},
        }

    @classmethod
    def action_from_call(cls, name: str, arguments: dict) -> str:
        """The action text a native call ``name(arguments)`` stands for, as
        :meth:`parse_action` reads it (the class's ``call_tag`` and ``call_arg`` decide:
        no instance is needed). Raises ValueError naming a missing argument."""
        if cls.call_tag is None:
            return (
                "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
            )
        value = arguments.get(cls.call_arg)
        if not isinstance(value, str):
            raise ValueError(
                f"tool {name!r} needs the string argument {cls.call_arg!r}, got {sorted(arguments)}"
            )
        return f"<{cls.call_tag}>{value}</{cls.call_tag}>"

    def parse_action(self, action: str) -> tuple[Any, bool]:
        """Return ``(parsed, True)`` if this tool handles ``action``, else ``(None, False)``."""
        raise NotImplementedError

    def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> ActionResult | Awaitable[ActionResult]:
        """Run ``parsed`` for one trajectory; return ``(observation, done, valid)``.

        May be ``async def`` (hence the ``Awaitable`` in the return type). Blocking sync
        implementations are run in a thread by the server. Errors the model caused must be observations, never exceptions.
        """
        raise NotImplementedError

    @property
    def verltool_compat(self) -> bool:
        """True when this tool answers in VerlTool's format."""
        return self.compat == VERLTOOL

    def keeps_state(self, extra_field: dict) -> bool:
        """True if this tool keeps per-trajectory state between calls that a later call
        depends on (a shell, a workspace, an interpreter, images), so that a trajectory
        resumed on a server that lost it is told its tool state was reset
        (``Dispatcher.step``). Default False: each call stands alone."""
        return False

    # --- per-trajectory state helpers ---------------------------------------------
    def load_env(self, trajectory_id: str) -> dict:
        """The trajectory's state dict (created empty on first use)."""
        self._last_used[trajectory_id] = time.monotonic()
        return self.env.setdefault(trajectory_id, {})

    def save_env(self, trajectory_id: str, env: dict) -> None:
        self._last_used[trajectory_id] = time.monotonic()
        self.env[trajectory_id] = env

    def delete_env(self, trajectory_id: str) -> None:
        """Free everything this tool holds for the trajectory (idempotent)."""
        env = self.env.pop(trajectory_id, None)
        self._last_used.pop(trajectory_id, None)
        if env is not None:
            self.on_delete(trajectory_id, env)

    def on_delete(self, trajectory_id: str, env: dict) -> None:
        """Hook: release external resources held in ``env``."""

    def expired(self, now: float | None = None) -> list[str]:
        """Trajectory ids idle for longer than ``settings.state_ttl_s``."""
        now = time.monotonic() if now is None else now
        ttl = self.settings.state_ttl_s
        return [t for t, last in list(self._last_used.items()) if now - last > ttl]

    def close(self) -> None:
        """Called once at server shutdown: free every trajectory's state."""
        for tid in list(self.env):
            self.delete_env(tid)

    # --- async lifecycle (optional; the server awaits these on its event loop) ------
    async def astart(self) -> None:
        """Hook: called once when the server starts (e.g. start a worker pool)."""

    async def aclose(self) -> None:
        """Called once at server shutdown; the default calls :meth:`close`."""
        self.close()
