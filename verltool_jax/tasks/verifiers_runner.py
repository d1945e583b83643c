"""The verifiers side of the ``verifiers`` task: a script run by the verifiers virtual
environment's python (scripts/setup.sh builds it; never imported by our code, which runs
it as a subprocess, so it imports nothing of ours and only verifiers and the standard
library)::

    python verifiers_runner.py rows    --taskset ID [--path DIR] [--args JSON] --num N
    python verifiers_runner.py episode --taskset ID [--path DIR] [--args JSON] [--model M] < row.json

``rows`` prints the first N tasks of the taskset as JSON (index, id, system prompt,
prompt). ``episode`` reads a data row of ours on stdin (the task's index in
``extra_info["verifiers_idx"]``) and plays that task once with verifiers' own machinery:
``Env.run_episode`` on the taskset's environment, the ``null`` harness (verifiers' chat
program) in the ``subprocess`` runtime, every model call through verifiers' interception
server to the OpenAI-compatible endpoint at ``$OPENAI_BASE_URL`` (the key in
``$OPENAI_API_KEY``); the task's rubric scores the trace. The last line of stdout is
``{"reward": r, "rewards": {...}, "turns": n}``; a failed episode exits 1 with the
error on stderr.

The chat program is a PEP 723 script that verifiers prepares with ``uv`` (a new
environment, packages downloaded at rollout time). Its declared packages (openai, mcp,
httpx, httpx2, tenacity, certifi) are verifiers' own dependencies, so here it runs with
this environment's python instead (``use_this_python``): nothing is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any


def load_taskset(args: argparse.Namespace) -> Any:
    import verifiers.v1 as vf

    if args.path:
        sys.path.insert(0, str(Path(args.path).resolve()))
        # the tool servers and the chat program are subprocesses: they import it too
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(args.path).resolve()), os.environ.get("PYTHONPATH")) if p
        )
    config_type = vf.taskset_config_type(args.taskset)
    config = config_type.model_validate({**json.loads(args.args or "{}"), "id": args.taskset})
    return config, vf.load_taskset(config)


def rows(args: argparse.Namespace) -> list[dict]:
    _, taskset = load_taskset(args)
    out = []
    for task in taskset.take(args.num):
        d = task.data
        prompt = d.prompt
        if not isinstance(prompt, str) and prompt is not None:
            prompt = [m.model_dump(mode="json", exclude_none=True) for m in prompt]
        out.append({"idx": d.idx, "id": d.id, "system_prompt": d.system_prompt, "prompt": prompt})
    return out


def use_this_python() -> None:
    """Register this python as the interpreter of verifiers' chat program (module doc)."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    data = CHAT_PROGRAM_SOURCE.encode()
    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_bytes() != data:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    SubprocessRuntime._interpreters[str(path)] = sys.executable


async def episode(args: argparse.Namespace, row: dict) -> dict:
    import verifiers.v1 as vf

    try:
        idx = int(row["extra_info"]["verifiers_idx"])
    except (KeyError, TypeError, ValueError):
        raise SystemExit("the data row has no extra_info.verifiers_idx") from None
    taskset_config, taskset = load_taskset(args)
    task = next(iter(taskset.include(idx=[f"{idx}:{idx + 1}"])), None)
    if task is None:
        raise SystemExit(f"taskset {args.taskset!r} has no task {idx}")
    use_this_python()
    env_config = vf.resolve_env_config(
        {
            "taskset": taskset_config.model_dump(),
            "interception": {"type": "server"},
            "agent": {
                "harness": {"id": "null"},
                "runtime": {"type": "subprocess"},
                "max_turns": args.max_turns,
            },
        }
    )
    env = vf.load_environment(env_config)
    client = vf.EvalClientConfig(
        base_url=os.environ["OPENAI_BASE_URL"], api_key_var="OPENAI_API_KEY"
    )
    ctx = vf.ModelContext(model=args.model, client=client)
    async with env.serving():
        result = await env.run_episode(task, ctx)
    if not result.ok or not result.traces:
        errors = [e.message for e in result.errors] + [
            e.message for t in result.traces for e in t.errors
        ]
        raise SystemExit(f"the verifiers episode failed: {errors}")
    trace = result.traces[-1]
    rewards = {k: (None if r is None else r.score) for k, r in trace.rewards.items()}
    return {"reward": trace.reward, "rewards": rewards, "turns": trace.num_turns}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("rows", "episode"))
    ap.add_argument("--taskset", required=True, help="the taskset's id (its module's name)")
    ap.add_argument("--path", default="", help="a folder to import the taskset from")
    ap.add_argument("--args", default="{}", help="the taskset config's fields, as JSON")
    ap.add_argument("--num", type=int, default=0, help="rows: how many tasks")
    ap.add_argument("--model", default="policy", help="episode: the model name to ask for")
    ap.add_argument("--max-turns", type=int, default=None, help="episode: model calls at most")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.command == "rows":
        print(json.dumps(rows(args)))
        return
    out = asyncio.run(episode(args, json.loads(sys.stdin.read())))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
