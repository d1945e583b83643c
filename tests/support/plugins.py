"""Installed packages made by hand for the plugin tests: a ``*.dist-info`` folder with
``METADATA`` and ``entry_points.txt`` next to the package's modules, in a folder that
goes on ``sys.path`` (in process) or ``PYTHONPATH`` (in a subprocess). This is exactly
what ``importlib.metadata`` reads for an installed package, without running pip."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

TOOL_GROUP = "verltool_jax.tools"
TASK_GROUP = "verltool_jax.tasks"
REWARD_GROUP = "verltool_jax.rewards"


def write_dist(
    root: Path,
    package: str,
    entry_points: dict[str, dict[str, str]],
    modules: dict[str, str],
    version: str = "1.0",
) -> Path:
    """Install distribution ``package`` under ``root``: ``entry_points`` is ``{group:
    {name: "module:attr"}}``, ``modules`` ``{"pkg/mod.py": source}``. Returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{package.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    lines = []
    for group, eps in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for rel, source in modules.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(source))
    return root


def forget_modules(prefixes: tuple[str, ...]) -> None:
    """Drop the plugin modules a test imported, so the next test imports its own."""
    for name in [m for m in sys.modules if m.split(".")[0] in prefixes]:
        del sys.modules[name]
    importlib.invalidate_caches()


GOOD_TOOL = """
    from tool_server.kit.base import BaseTool

    class ShoutTool(BaseTool):
        name = "shout"
        usage = "<shout>text</shout> -> TEXT"

        def parse_action(self, action):
            ok = action.startswith("<shout>") and action.endswith("</shout>")
            return (action[7:-8], True) if ok else (None, False)

        def conduct_action(self, trajectory_id, parsed, extra_field):
            return parsed.upper(), False, True
"""

BROKEN_MODULE = """
    raise ImportError("this plugin needs libfoo, which is not installed")
"""
