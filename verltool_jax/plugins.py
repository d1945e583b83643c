"""``python -m verltool_jax.plugins [--list-tasks] [--list-rewards] [--list-tools]``

Prints the tasks (``task.name``), rewards (``reward.name``, and the data sources each
serves) and tools (``tool_server.tools``) a run can use, and where each comes from:
``built-in`` or ``package NAME VERSION`` for a plugin that an installed package declares
under the entry-point groups ``verltool_jax.tasks``, ``verltool_jax.rewards`` and
``verltool_jax.tools``. A plugin that cannot be used (a clash or a failed import) is
listed as UNUSABLE with the reason. No flag lists all three. Exit 0. Writing a plugin:
docs/plugins.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from tool_server.kit.plugins import BUILTIN


@dataclass(frozen=True)
class Listed:
    """One row of a listing: ``detail`` is what the name serves, or its problem."""

    name: str
    source: str
    detail: str
    ok: bool = True


def list_tasks() -> list[Listed]:
    """Built-in tasks and every task plugin (plugins imported to check them)."""
    from verltool_jax.tasks import BUILTIN as BUILTIN_TASKS
    from verltool_jax.tasks import task_plugins

    group = task_plugins()
    loaded = group.load_all()
    rows = [Listed(n, BUILTIN, f"verltool_jax.tasks.{m}") for n, m in BUILTIN_TASKS.items()]
    for name in group.names():
        if name in loaded:
            rows.append(Listed(name, group.source(name), group.plugins[name].value))
        else:
            rows.append(Listed(name, group.source(name), group.problems[name], ok=False))
    return sorted(rows, key=lambda r: (r.name, not r.ok))


def list_rewards() -> list[Listed]:
    """Every reward with the data sources routed to it; plugins that cannot be used."""
    from verltool_jax.rewards import DATA_SOURCES, REWARDS
    from verltool_jax.rewards.base import reward_plugins

    group = reward_plugins()
    served: dict[str, list[str]] = {}
    for ds, reward in DATA_SOURCES.items():
        served.setdefault(reward, []).append(ds)
    rows = []
    for name in REWARDS.names():
        source = group.source(name) if name in group.plugins else BUILTIN
        sources = ", ".join(sorted(served.get(name, []))) or "-"
        rows.append(Listed(name, source, f"data_source: {sources}"))
    for name in sorted(group.problems):
        rows.append(Listed(name, group.source(name), group.problems[name], ok=False))
    return sorted(rows, key=lambda r: (r.name, not r.ok))


def list_tools() -> list[Listed]:
    """What ``python -m tool_server --list-tools`` lists (built-in tools and plugins)."""
    from tool_server.registry import list_tools as tool_rows

    return [Listed(r.name, r.source, r.usage, r.ok) for r in tool_rows()]


def plugins_of_run(rc) -> list[str]:
    """``"task NAME (package P V)"`` for the run's task, each of the tools it starts a
    server with and its rewards (``reward.name``, else every reward plugin, as any may
    serve a row's data_source) that come from installed packages; printed when a run
    starts so a run's log says which packages it depended on."""
    from tool_server.registry import tool_plugins
    from verltool_jax.rewards.base import reward_plugins
    from verltool_jax.tasks import task_plugins

    out = []
    tasks = task_plugins()
    if rc.task is not None and rc.task.name in tasks.plugins:
        out.append(f"task {rc.task.name} ({tasks.source(rc.task.name)})")
    tools = tool_plugins()
    if not rc.tool_server.url:
        out += [f"tool {t} ({tools.source(t)})" for t in rc.tool_server.tools if t in tools.plugins]
    rewards = reward_plugins()
    names = [rc.reward.name] if rc.reward.name else sorted(rewards.plugins)
    usable = set(rewards.plugins) - set(rewards.problems)
    out += [f"reward {r} ({rewards.source(r)})" for r in names if r in usable]
    return out


def format_rows(title: str, rows: list[Listed]) -> str:
    """A plain table: name, source, detail (``UNUSABLE: reason`` for a broken plugin)."""
    width = max([len(r.name) for r in rows] + [len(title)])
    src = max([len(r.source) for r in rows] + [6])
    lines = [f"{title:<{width}}  {'source':<{src}}  detail"]
    for r in rows:
        detail = r.detail.replace("\n", " ") if r.ok else f"UNUSABLE: {r.detail}"
        lines.append(f"{r.name:<{width}}  {r.source:<{src}}  {detail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verltool_jax.plugins",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--list-tasks", action="store_true", help="tasks (task.name)")
    p.add_argument("--list-rewards", action="store_true", help="rewards (reward.name)")
    p.add_argument("--list-tools", action="store_true", help="tools (tool_server.tools)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    every = not (args.list_tasks or args.list_rewards or args.list_tools)
    tables = []
    if every or args.list_tasks:
        tables.append(format_rows("task", list_tasks()))
    if every or args.list_rewards:
        tables.append(format_rows("reward", list_rewards()))
    if every or args.list_tools:
        tables.append(format_rows("tool", list_tools()))
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
