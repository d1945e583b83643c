"""The trainer's side of the gateway: the agent program a run names, the reward rule, and
the bookkeeping of an episode that a template break split into several trajectories.

* ``gateway.agent = "module:function"`` (or ``"path/to/file.py:function"``) names the
  program: ``function(base_url, data_row, **kwargs) -> reward | None``, a coroutine
  function (one asyncio task per trajectory) or a plain function (run in a thread). The
  key is in ``base_url`` (``.../t/<key>/v1``), so ``api_key`` can be anything. kwargs are
  ``gateway.agent_args``, plus ``tool_url`` (the run's tool server) when the function
  takes a parameter of that name.
* ``gateway.reward`` combines the task's verifier score ``v`` with the program's reward
  ``p`` (its return value or ``POST /t/<key>/reward``), see :func:`combine_reward`.
* An episode split by a break is several trajectories ("pieces", ``data["gateway_episode"]``
  names the episode). It is scored once, on the model text of all its pieces in order
  (the final answer is in the last piece), and every piece gets that reward; the group
  statistics of the advantage count it once (``algos.advantages.episode_advantages``);
  ``rewards.compute.score_episodes`` does the scoring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

REWARD_RULES = ("verifier", "program", "sum")
NO_PROGRAM_REWARD = "gateway.reward needs the program's reward but the agent program gave none"


def combine_reward(rule: str, verifier: float, program: float | None) -> float | None:
    """The trained reward of an episode under ``gateway.reward``:

    * ``verifier``: ``r = v`` (the task's verifier; the program's reward is only logged);
    * ``program``: ``r = p`` (the program is the judge; ``v`` stays the logged accuracy);
    * ``sum``: ``r = v + p`` (``p = 0`` when the program gave none), e.g. a verifier for
      correctness and a program's shaping term.

    None when the rule needs ``p`` and there is none (the episode is not trained on)."""
    if rule == "verifier":
        return float(verifier)
    if rule == "program":
        return None if program is None else float(program)
    if rule == "sum":
        return float(verifier) + (0.0 if program is None else float(program))
    raise ValueError(f"gateway.reward={rule!r} must be one of {list(REWARD_RULES)}")


def load_agent(spec: str) -> Callable[..., Any]:
    """The callable named by ``gateway.agent``: ``"package.module:function"`` or
    ``"path/to/file.py:function"``; a ValueError naming the field and the fix."""
    mod_name, sep, fn_name = spec.rpartition(":")
    if not sep or not mod_name or not fn_name.isidentifier():
        raise ValueError(
            f"gateway.agent={spec!r} must be 'module:function' or 'path/to/file.py:function'"
        )
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            loader = importlib.util.spec_from_file_location(f"gateway_agent_{path.stem}", path)
            assert loader is not None and loader.loader is not None
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except Exception as e:
        raise ValueError(f"gateway.agent={spec!r}: cannot load {mod_name!r}: {e!r}") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"gateway.agent={spec!r}: {mod_name!r} has no function {fn_name!r}")
    return fn


def bind_agent(fn: Callable[..., Any], tool_url: str, args: dict) -> Callable[..., Any]:
    """``fn(base_url, data_row)`` with ``args`` (and ``tool_url`` if ``fn`` takes it) bound;
    a coroutine function stays one."""
    params = inspect.signature(fn).parameters
    kw = dict(args)
    if "tool_url" in params and "tool_url" not in kw:
        kw["tool_url"] = tool_url
    if not inspect.iscoroutinefunction(fn):
        return functools.partial(fn, **kw) if kw else fn

    async def agent(base_url: str, data: dict) -> Any:
        return await fn(base_url, data, **kw)

    return agent


def episode_of(t: Any, index: int) -> str:
    """The episode a trajectory is a piece of (the gateway's key), else its own row."""
    return str((t.data or {}).get("gateway_episode") or f"#row{index}")


def episodes(trajs: Sequence[Any]) -> list[list[int]]:
    """Row indices of each episode, pieces in order, episodes in first-seen order."""
    out: dict[str, list[int]] = {}
    for i, t in enumerate(trajs):
        out.setdefault(episode_of(t, i), []).append(i)
    return list(out.values())


def joined(pieces: Sequence[Any]) -> Any:
    """One trajectory to score an episode by: the last piece with the model text of all
    pieces (their response tokens and loss masks in order) and all their tool calls."""
    last = pieces[-1]
    if len(pieces) == 1:
        return last
    return dataclasses.replace(
        last,
        response_ids=[x for p in pieces for x in p.response_ids],
        loss_mask=[x for p in pieces for x in p.loss_mask],
        tool_calls=sum(p.tool_calls for p in pieces),
        invalid_tool_calls=sum(p.invalid_tool_calls for p in pieces),
    )


@contextlib.asynccontextmanager
async def serving(gateway: Any, settings: Any) -> AsyncIterator[None]:
    """Serve ``gateway`` (if not None) on ``settings.host:settings.port`` (the ``gateway``
    config section; port 0: a free one) for the block, in the running event loop."""
    if gateway is None:
        yield
        return
    await gateway.start(settings.host, settings.port)
    try:
        yield
    finally:
        await gateway.stop()
