"""``openenv``: drive an OpenEnv environment server, one episode per trajectory.

An action ``<env>text</env>`` is one step of the trajectory's episode: the text fills the
string field ``openenv_action_field`` of the environment's action and the answer is the
observation (one field of it, or all its fields as JSON), with the step's ``reward`` in
the observation payload (the ``env_reward`` reward sums them) and the episode's ``done``
ending the trajectory. The episode is one OpenEnv WebSocket session (OpenEnv's own
client), opened at the trajectory's first action with ``reset(seed=extra_field
["openenv_seed"])`` (the seed the ``openenv`` task wrote into the row, so the episode
is the one whose first observation the prompt shows; the environment must be
deterministic in its seed) and closed when the trajectory ends. The protocol is spoken by
``tool_server/kit/openenv.py`` (no ``openenv-core`` needed here).

Options (``--tool-opt``):

* ``openenv_url=http://host:port`` - the environment server (required);
* ``openenv_action_field`` - the action's string field (default ``message``);
* ``openenv_obs_field`` - the observation field shown (default: every field as JSON);
* ``openenv_timeout_s`` - per step (default and at most 0.9 x the server's ``--timeout``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tool_server.kit.base import BaseTool, Observation
from tool_server.kit.openenv import SEED_FIELD, OpenEnvError, OpenEnvSession, observation_text
from tool_server.kit.options import tool_option
from tool_server.kit.shell import command_timeout
from tool_server.kit.tags import last_tag_body

log = logging.getLogger("tool_server.openenv")


class OpenEnvTool(BaseTool):
    """Steps of one OpenEnv environment's episodes (see the module doc)."""

    name = "openenv"
    usage = "<env>your action</env> acts in the environment; the answer is what it observes"
    call_tag = "env"
    call_arg = "action"

    def __init__(self, settings=None) -> None:
        super().__init__(settings)
        extra = self.settings.extra
        self.url = tool_option(extra, "openenv_url", str, "", env="VERLTOOL_OPENENV_URL")
        self.action_field = tool_option(extra, "openenv_action_field", str, "message")
        self.obs_field = tool_option(extra, "openenv_obs_field", str, "")
        self._closing: set[asyncio.Task] = set()

    async def astart(self) -> None:
        if not self.url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(
                "the openenv tool needs --tool-opt openenv_url=http://host:port "
                f"(an OpenEnv environment server), got {self.url!r}"
            )

    def keeps_state(self, extra_field: dict) -> bool:
        return True  # the environment session

    def parse_action(self, action: str) -> tuple[Any, bool]:
        body = last_tag_body(action, "env")
        return (body, True) if body is not None else (None, False)

    async def conduct_action(
        self, trajectory_id: str, parsed: Any, extra_field: dict
    ) -> tuple[Observation, bool, bool]:
        timeout = command_timeout(self.settings.extra, "openenv_timeout_s", self.settings.timeout_s)
        env = self.load_env(trajectory_id)
        try:
            if "session" not in env:
                session = OpenEnvSession(self.url, timeout)
                env["session"] = session  # kept first, so a failed reset is still closed
                seed = extra_field.get(SEED_FIELD)
                await session.reset(**({} if seed is None else {"seed": int(seed)}))
            result = await env["session"].step({self.action_field: parsed})
        except TimeoutError:
            obs = f"The environment did not answer within {timeout:g} s."
            return {"obs": obs, "invalid_reason": "openenv_timeout"}, False, False
        except OpenEnvError as e:  # e.g. an action the environment's schema rejects
            obs = f"The environment refused the action: {e}"
            return {"obs": obs, "invalid_reason": "openenv_error"}, False, False
        except (ConnectionError, OSError) as e:
            obs = f"The environment is unavailable: {e}"
            return {"obs": obs, "invalid_reason": "openenv_unavailable"}, False, False
        out: dict = {"obs": observation_text(result.observation, self.obs_field)}
        if result.reward is not None:
            out["reward"] = result.reward
        return out, result.done, True

    def on_delete(self, trajectory_id: str, env: dict) -> None:
        session = env.get("session")
        if session is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (server shutdown after the loop): nothing to await
            return
        task = loop.create_task(session.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        self.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
