"""Shared helpers for the tool-server tests (not collected: no ``test_`` prefix)."""

from __future__ import annotations

import os
import textwrap

# A tool file written to a temporary --tool-dir: proves "add a tool from a file" and
# gives the fault-injection actions the load/fault tests need.
FAULTY_TOOL_SOURCE = textwrap.dedent("""
    import asyncio, time
    from tool_server.kit.base import BaseTool

    class FaultyTool(BaseTool):
        name = "faulty"
        usage = "<echo>x</echo> <count/> <raise/> <hang/> <block/> <big/> <done/> <bad/>"

        def parse_action(self, action):
            for tag in ("echo", "count", "raise", "hang", "block", "big", "done", "bad"):
                if action.startswith("<" + tag):
                    return (tag, action), True
            return None, False

        async def conduct_action(self, trajectory_id, parsed, extra_field):
            tag, action = parsed
            if tag == "echo":
                return {"obs": f"{trajectory_id}|{action}", "reward": 0.5,
                        "metrics": {"n": len(action)}}, False, True
            if tag == "count":
                env = self.load_env(trajectory_id)
                env["n"] = env.get("n", 0) + 1
                self.save_env(trajectory_id, env)
                return f"count={env['n']}", False, True
            if tag == "raise":
                raise RuntimeError("boom from the tool")
            if tag == "hang":
                await asyncio.sleep(3600)
            if tag == "block":
                await asyncio.to_thread(time.sleep, 3600)
            if tag == "big":
                return "x" * 100000, False, True
            if tag == "done":
                return "finished", True, True
            if tag == "bad":
                return "not a tuple"

    class SyncTool(BaseTool):
        name = "synctool"
        usage = "<sync>x</sync>"

        def parse_action(self, action):
            return (action, True) if action.startswith("<sync>") else (None, False)

        def conduct_action(self, trajectory_id, parsed, extra_field):
            if "sleep" in parsed:
                time.sleep(60)
            return f"sync:{trajectory_id}", False, True
""")


def write_faulty_tool(directory: str) -> str:
    path = os.path.join(directory, "faulty.py")
    with open(path, "w") as f:
        f.write(FAULTY_TOOL_SOURCE)
    return directory


def obs_text(obs) -> str:
    """The text of an observation (string or {"obs": ...})."""
    return obs if isinstance(obs, str) else obs.get("obs", "")


def one(url: str, tid: str, action: str, **kw):
    """POST one action; returns (observation, done, valid)."""
    from tool_server.launcher import post_json

    body = {"trajectory_ids": [tid], "actions": [action]}
    for k, v in kw.items():
        body[k] = [v]
    status, out = post_json(url + "/get_observation", body)
    assert status == 200, out
    return out["observations"][0], out["dones"][0], out["valids"][0]
