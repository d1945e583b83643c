"""One of our tasks as an OpenEnv environment: ``python -m verltool_jax.environments.openenv_server``.

Another trainer drives the task through OpenEnv's client (``EnvClient`` over the ``/ws``
WebSocket; one connection is one episode): ``reset`` draws a prompt row of the task and
returns its chat messages; ``step(TaskAction(text=turn))`` takes one model turn. A turn
that ends on one of ``rollout.action_stop_strings`` is a tool call: it goes to our tool
server (the trajectory's state lives there until the episode ends) and the observation is
the tool's answer. Any other turn, or a tool call past ``rollout.max_turns``, is the final
answer: the episode ends and its reward is our reward function of the task (by
``reward.name`` or the row's ``data_source``, with the config's shaping) on the text of all
the model's turns, exactly as our trainer scores a trajectory. The environment is
configured by one of our run configs (``--config configs/tiny_math.py:smoke``): the task
(``task.name``, or ``data.train_files`` / ``data.eval_files``), the tool server (started
with ``tool_server.tools``, or ``tool_server.url``), the rollout's action stop strings,
turn limit and observation template, and the reward section.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import random
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verltool_jax.environments import require_openenv

require_openenv()

from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402
from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402

from tool_server.client import ToolClient  # noqa: E402
from tool_server.launcher import serve_tools  # noqa: E402
from verltool_jax.cli import ConfigError, parse_command_line  # noqa: E402
from verltool_jax.data.readers import read_files  # noqa: E402
from verltool_jax.rewards.compute import RewardPool, make_item  # noqa: E402
from verltool_jax.rollout.turns import row_extra_field  # noqa: E402
from verltool_jax.run_config import run_config_from_dict  # noqa: E402
from verltool_jax.tasks import prepare_task  # noqa: E402

log = logging.getLogger(__name__)


class TaskAction(Action):
    """One model turn, as generated (a tool call ends on one of ``action_stop_strings``)."""

    text: str = Field(description="the model's turn")


class TaskObservation(Observation):
    """After ``reset``: the prompt (``messages``, the row's chat prompt; ``text``, its last
    user message). After a tool call: ``text`` is the tool's answer and ``formatted`` the
    answer in ``rollout.obs_template`` (what our loop appends to the context). At the end:
    ``reward``, ``correct`` and the reward's details in ``info``. (OpenEnv does not send
    ``metadata`` over the wire, so what a client needs is in fields.)"""

    text: str = ""
    formatted: str = ""
    messages: list[dict] = Field(default_factory=list)
    valid: bool = True  # False: a tool call no tool claimed or the tool rejected
    correct: bool | None = None  # at the end: the reward's verdict
    info: dict = Field(default_factory=dict)  # row index, tool payload, reward details
    action_stop_strings: list[str] = Field(default_factory=list)


class TaskState(State):
    """The episode: which row, how many tool calls, whether it ended."""

    row_index: int = -1
    data_source: str = ""
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    finished: bool = False


@dataclass
class TaskEnvSettings:
    """What every episode of the served task shares (built once by :func:`task_settings`)."""

    rows: list[dict]
    tool_client: ToolClient
    reward_pool: RewardPool
    action_stop_strings: tuple[str, ...]
    max_turns: int
    obs_template: str
    seed: int = 0
    score_lock: asyncio.Lock | None = None  # one scoring at a time (the pool is shared)


def is_tool_call(text: str, stop_strings: Sequence[str]) -> bool:
    """True if ``text`` ends on one of ``stop_strings`` (trailing whitespace ignored),
    as a turn our sampler stopped on an action stop string does."""
    tail = text.rstrip()
    return any(s and tail.endswith(s.rstrip()) for s in stop_strings)


class TaskEnvironment(Environment[TaskAction, TaskObservation, TaskState]):
    """One episode at a time of a task of ours (see the module doc). Use the async
    methods (the WebSocket path does); the sync ones run them in their own event loop."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, settings: TaskEnvSettings) -> None:
        super().__init__()
        self.settings = settings
        self._state = TaskState()
        self._row: dict | None = None
        self._texts: list[str] = []
        self._tid = ""
        self._draws = random.Random(settings.seed)

    # --- OpenEnv interface -----------------------------------------------------------
    @property
    def state(self) -> TaskState:
        return self._state

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> TaskObservation:
        return asyncio.run(self.reset_async(seed, episode_id, **kwargs))

    def step(
        self, action: TaskAction, timeout_s: float | None = None, **kwargs: Any
    ) -> TaskObservation:
        return asyncio.run(self.step_async(action, timeout_s, **kwargs))

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        index: int | None = None,
        **kwargs: Any,
    ) -> TaskObservation:
        """Start an episode on row ``index``, else a row drawn with ``seed`` (the same
        seed gives the same row), else the next draw of this session."""
        await self._end_trajectory()
        rows = self.settings.rows
        if index is not None:
            if not 0 <= index < len(rows):
                raise ValueError(
                    f"reset index={index} is out of range: the task has {len(rows)} rows"
                )
            i = int(index)
        elif seed is not None:
            i = random.Random(seed).randrange(len(rows))
        else:
            i = self._draws.randrange(len(rows))
        self._row = row = rows[i]
        self._texts = []
        self._tid = f"openenv-{uuid.uuid4().hex}"
        self._state = TaskState(
            episode_id=episode_id or self._tid, row_index=i, data_source=row["data_source"]
        )
        messages = [dict(m) for m in row["prompt"]]
        users = [m["content"] for m in messages if m.get("role") == "user"]
        return TaskObservation(
            text=str(users[-1]) if users else "",
            messages=messages,
            action_stop_strings=list(self.settings.action_stop_strings),
            info={"row_index": i, "data_source": row["data_source"]},
        )

    async def step_async(
        self, action: TaskAction, timeout_s: float | None = None, **kwargs: Any
    ) -> TaskObservation:
        """Run one turn (see the module doc)."""
        st, s = self._state, self.settings
        if self._row is None:
            raise ValueError("step before reset: call reset() to start an episode")
        if st.finished:
            raise ValueError("the episode has ended; call reset() to start another")
        self._texts.append(action.text)
        st.step_count += 1
        if is_tool_call(action.text, s.action_stop_strings) and st.tool_calls < s.max_turns:
            res = await s.tool_client.get_observation(
                self._tid,
                action.text,
                row_extra_field(self._row),
                is_last_step=st.tool_calls + 1 >= s.max_turns,
            )
            st.tool_calls += 1
            st.invalid_tool_calls += int(not res.valid)
            obs = TaskObservation(
                text=res.observation,
                formatted=s.obs_template.format(obs=res.observation),
                valid=res.valid,
                info={k: v for k, v in res.extra.items() if k != "image"},
            )
            if not res.done:
                return obs
        else:
            obs = TaskObservation()
        return await self._finish(obs)

    def close(self) -> None:
        """Free the tool server's state of an episode left unfinished (OpenEnv calls this
        in a worker thread when the connection closes)."""
        tid, self._tid = self._tid, ""
        if tid and self._state.tool_calls and not self._state.finished:

            async def finish() -> None:
                async with ToolClient(",".join(self.settings.tool_client.urls)) as client:
                    await client.finish(tid)

            try:
                asyncio.run(finish())
            except Exception as e:  # the server frees it after state_ttl_s anyway
                log.warning("could not free trajectory %s on the tool server: %r", tid, e)

    # --- helpers ---------------------------------------------------------------------
    async def _finish(self, obs: TaskObservation) -> TaskObservation:
        """End the episode: score the model's turns, free the tool server's state."""
        st, s = self._state, self.settings
        assert self._row is not None  # step_async checked it
        st.finished = True
        item = make_item(
            self._row,
            "".join(self._texts),
            s.reward_pool.reward_name,
            st.tool_calls,
            st.invalid_tool_calls,
        )
        lock = s.score_lock or asyncio.Lock()
        async with lock:
            (result,) = await s.reward_pool.score_async([item])
        await self._end_trajectory()
        obs.done = True
        obs.reward = float(result.score)
        obs.correct = bool(result.correct)
        obs.info = dict(obs.info, reward_info=result.info)
        return obs

    async def _end_trajectory(self) -> None:
        if self._tid and self._state.tool_calls:
            await self.settings.tool_client.finish(self._tid)
        self._tid = ""


class TaskEnvClient(EnvClient[TaskAction, TaskObservation, TaskState]):
    """OpenEnv's WebSocket client with this environment's types:
    ``async with TaskEnvClient(base_url="http://host:port") as env: await env.reset()``
    (``.sync()`` for the blocking version). ``GenericEnvClient`` works too, with dicts."""

    def _step_payload(self, action: TaskAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TaskObservation]:
        obs = TaskObservation(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=bool(payload.get("done", False)),
        )
        return StepResult(observation=obs, reward=obs.reward, done=obs.done)

    def _parse_state(self, payload: dict[str, Any]) -> TaskState:
        return TaskState(**payload)


def task_rows(run_config: Any, split: str, data_dir: Path) -> list[dict]:
    """The prompt rows of the config's task (``task.name``: its data written under
    ``data_dir``; else ``data.train_files`` / ``data.eval_files``) of ``split``."""
    if split not in ("train", "eval"):
        raise ValueError(f"--split must be 'train' or 'eval', got {split!r}")
    if run_config.task is not None:
        files = prepare_task(run_config, data_dir)
        paths = [files.train] if split == "train" else files.eval
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    else:
        paths = list(
            run_config.data.train_files if split == "train" else run_config.data.eval_files
        )
        if not paths:
            raise ValueError(
                f"the config has no task.name and no data.{split}_files: name a task or give files"
            )
    rows = read_files(paths, run_config.data.format)
    if not rows:
        raise ValueError(f"the {split} split of the task has no rows")
    return rows


@contextmanager
def task_settings(
    run_config: Any, split: str = "train", data_dir: str | Path | None = None
) -> Iterator[TaskEnvSettings]:
    """The settings of ``run_config``'s task as an environment: its rows, a tool server
    (started with ``tool_server.tools`` unless ``tool_server.url`` names one; stopped on
    exit) and the reward pool of its ``reward`` section. ``run_config``: a ``RunConfig``
    or its config dict (validated here)."""
    if not dataclasses.is_dataclass(run_config):
        run_config = run_config_from_dict(run_config)
    with ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="vtj_openenv_"))
        rows = task_rows(run_config, split, Path(data_dir))
        url, _ = stack.enter_context(serve_tools(run_config.tool_server))
        pool = stack.enter_context(RewardPool.from_config(run_config.reward))
        r = run_config.rollout
        yield TaskEnvSettings(
            rows=rows,
            tool_client=ToolClient(url, timeout_s=run_config.tool_server.timeout_s + 5.0),
            reward_pool=pool,
            action_stop_strings=tuple(r.action_stop_strings),
            max_turns=r.max_turns,
            obs_template=r.obs_template,
            seed=run_config.data.seed,
            score_lock=asyncio.Lock(),
        )


def make_app(settings: TaskEnvSettings, max_concurrent_envs: int = 64) -> Any:
    """The FastAPI app (OpenEnv's ``create_fastapi_app``) serving episodes of ``settings``;
    its tool client's connections close with the app (they belong to the app's loop)."""
    app = create_fastapi_app(
        lambda: TaskEnvironment(settings),
        TaskAction,
        TaskObservation,
        max_concurrent_envs=max_concurrent_envs,
    )
    app.router.on_shutdown.append(settings.tool_client.close)
    return app


FLAGS = {"host": "127.0.0.1", "port": "8000", "split": "train", "max_sessions": "64"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        argparse.ArgumentParser(
            prog="python -m verltool_jax.environments.openenv_server",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ).print_help()
        print(
            "\nflags: --config FILE[:ARG] [--config.KEY=VALUE ...] "
            + " ".join(f"[--{k}={v}]" for k, v in FLAGS.items())
        )
        return 0
    try:
        cl = parse_command_line(argv, flags=FLAGS)
        port, sessions = int(cl.flags["port"]), int(cl.flags["max_sessions"])
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="[openenv] %(message)s")
    with task_settings(cl.config, cl.flags["split"]) as settings:
        log.info("serving %d rows on http://%s:%d", len(settings.rows), cl.flags["host"], port)
        uvicorn.run(make_app(settings, sessions), host=cl.flags["host"], port=port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
