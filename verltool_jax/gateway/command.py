"""An agent program that is any command: ``gateway.agent =
"verltool_jax.gateway.command:run_command"`` with ``gateway.agent_args = {"command":
["prog", "arg", ...]}`` runs the command once per trajectory, so a program in another
language or another virtual environment is trained without a line of our code in it.

The command gets the trajectory's endpoint in the OpenAI SDK's own variables,
``OPENAI_BASE_URL`` (``.../t/<key>/v1``) and ``OPENAI_API_KEY`` (the key), the model
name in ``OPENAI_MODEL`` and the episode's routes (``/reward``, ``/end``) under
``VTJ_GATEWAY_EPISODE_URL``; the data row as JSON on stdin. Its reward, if it has one:
the last non-empty line of its stdout, a number or a JSON object with a numeric
``"reward"``, or ``POST $VTJ_GATEWAY_EPISODE_URL/reward``. A non-zero exit, or a command
still running after ``timeout_s`` (killed with its process group), raises: the
episode is an error record, not trained on (``producer.run_episode``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

STDERR_TAIL = 2000  # characters of a failed command's stderr kept in the error


def episode_env(base_url: str, model: str) -> dict[str, str]:
    """The variables that point a program at the trajectory ``base_url`` (``.../t/<key>/v1``)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return {
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": root.rsplit("/", 1)[-1],
        "OPENAI_MODEL": model,
        "VTJ_GATEWAY_EPISODE_URL": root,
    }


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):  # numpy arrays and scalars of a row read from parquet
        return x.tolist()
    raise TypeError(f"a data row value of type {type(x).__name__} is not JSON")


def parse_reward(stdout: str) -> float | None:
    """The reward on the last non-empty line of ``stdout`` (module doc), else None."""
    lines = [s for s in stdout.splitlines() if s.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


async def run_command(
    base_url: str,
    data: dict,
    command: Sequence[str],
    timeout_s: float = 600.0,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    model: str = "policy",
) -> float | None:
    """Run ``command`` for one trajectory (module doc); the reward on its stdout or None.
    ``env`` is added to our environment and the episode's variables; ``model`` is the
    gateway's model name (``gateway.model``)."""
    argv = [str(a) for a in command]
    if not argv:
        raise ValueError("gateway.agent_args.command is empty: give the program to run")
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **episode_env(base_url, model), **(env or {})},
        cwd=cwd,
        start_new_session=True,  # its own process group: a timeout kills its children too
    )
    row = json.dumps(data, default=_jsonable).encode()
    try:
        out, err = await asyncio.wait_for(proc.communicate(row), timeout_s)
    except TimeoutError:
        raise TimeoutError(f"{argv[0]} ran past timeout_s={timeout_s:g}") from None
    finally:
        if proc.returncode is None:  # timed out or cancelled
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-STDERR_TAIL:] or "<no stderr>"
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {tail}")
    return parse_reward(out.decode(errors="replace"))
