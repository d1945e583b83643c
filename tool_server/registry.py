"""Tool discovery: every ``*.py`` file in ``tool_server/tools/`` (and in any extra
``--tool-dir``) that defines a :class:`BaseTool` subclass with a ``name`` is a tool.
Files whose name starts with ``_`` (helpers) and ``base.py`` are skipped. Installed
packages add tools through the entry-point group ``verltool_jax.tools`` (the entry
point's name is the tool's name, its value the ``BaseTool`` subclass; see
:mod:`tool_server.kit.plugins` and docs/plugins.md).

Lookup is lazy: for a requested name the file ``<name>.py`` is tried first, and the
rest of the folder is imported only when that does not define it, so starting a server
for two tools does not import every other tool's heavy dependencies. A ``--tool-dir``
file wins over a built-in of the same name; a plugin may not reuse a built-in's name.
A plugin that fails to import is logged and left out; a server asked for that very tool
serves the others and reports it (``/health`` ``unavailable_tools``, with the package's
name): fail closed for that tool only.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import cast

from tool_server.kit.base import BaseTool
from tool_server.kit.plugins import BUILTIN, PluginError, PluginGroup, discover

log = logging.getLogger("tool_server.registry")

BUILTIN_TOOL_DIR = Path(__file__).resolve().parent / "tools"
TOOLS_GROUP = "verltool_jax.tools"  # entry-point group of tools from installed packages


def _module_for(path: Path) -> ModuleType | None:
    """Import one tool file; builtin files as ``tool_server.tools.<stem>``, others under
    a private module name. Returns ``None`` (and logs) if the import fails."""
    try:
        if path.parent == BUILTIN_TOOL_DIR:
            return importlib.import_module(f"tool_server.tools.{path.stem}")
        mod_name = f"tool_server_extra_tools.{abs(hash(str(path.parent)))}.{path.stem}"
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ImportError("not a loadable Python source file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
        return module
    except Exception as e:  # a broken tool file must not break the others
        log.warning("could not import tool file %s: %s: %s", path, type(e).__name__, e)
        return None


def tools_in_module(module: ModuleType) -> dict[str, type[BaseTool]]:
    """``{name: class}`` for the BaseTool subclasses defined in ``module``."""
    out = {}
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if (
            issubclass(obj, BaseTool)
            and obj is not BaseTool
            and obj.name
            and obj.__module__ == module.__name__
        ):
            out[obj.name] = obj
    return out


def _tool_files(dirs: Iterable[Path]) -> list[Path]:
    files = []
    for d in dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"tool directory {str(d)!r} does not exist (--tool-dir)")
        for f in sorted(d.glob("*.py")):
            if not f.name.startswith("_") and f.name != "base.py":
                files.append(f)
    return files


def builtin_tool_names() -> list[str]:
    """The built-in tools' names without importing them: every built-in tool file is
    named after its tool (``tests/tool_server/test_plugins.py`` checks it)."""
    return [f.stem for f in _tool_files([BUILTIN_TOOL_DIR])]


def _check_tool(name: str, obj: object) -> str | None:
    """What is wrong with ``obj`` as the tool of entry point ``name`` (None: nothing)."""
    if not (inspect.isclass(obj) and issubclass(obj, BaseTool)) or obj is BaseTool:
        return f"points at {obj!r}, not a subclass of tool_server.kit.base.BaseTool"
    if obj.name != name:
        return (
            f"points at {obj.__qualname__}, whose name is {obj.name!r}: the entry "
            "point's name must be the tool's name"
        )
    return None


_PLUGINS: PluginGroup | None = None


def tool_plugins(refresh: bool = False) -> PluginGroup:
    """The tools installed packages declare (discovered once per process; ``refresh``
    reads the installed packages again)."""
    global _PLUGINS
    if _PLUGINS is None or refresh:
        _PLUGINS = discover(TOOLS_GROUP, "tool", builtin_tool_names(), _check_tool)
    return _PLUGINS


def discover_tools(
    names: list[str] | None = None,
    tool_dirs: Iterable[str] = (),
    unusable: dict[str, str] | None = None,
) -> dict[str, type]:
    """Find tool classes. With ``names``, return exactly those (raising ``KeyError``
    naming the missing ones and the available ones, and :class:`PluginError` for a
    requested plugin that cannot be used, unless ``unusable`` is given: then the plugin's
    problem goes there and the name is left out); without, every tool found (unusable
    plugins logged and left out)."""
    dirs = [Path(d).resolve() for d in tool_dirs] + [BUILTIN_TOOL_DIR]
    for d in dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"tool directory {str(d)!r} does not exist (--tool-dir)")
    plugins = tool_plugins()
    found: dict[str, type[BaseTool]] = {}
    if names:
        wanted = []
        for name in names:
            try:
                if name in plugins.problems:  # a clash with a built-in, or a known failure
                    raise PluginError(plugins.problems[name])
                if not any((d / f"{name}.py").is_file() for d in dirs) and name in plugins.plugins:
                    found[name] = cast(
                        "type[BaseTool]", plugins.load(name)
                    )  # checked by _check_tool
            except PluginError as e:
                if unusable is None:
                    raise
                unusable[name] = str(e)
                continue
            wanted.append(name)
        names = wanted
        for name in names:
            for d in dirs:
                f = d / f"{name}.py"
                if f.is_file():
                    mod = _module_for(f)
                    if mod is not None:
                        found.update(
                            {k: v for k, v in tools_in_module(mod).items() if k not in found}
                        )
                if name in found:
                    break
        if all(n in found for n in names):
            return {n: found[n] for n in names}
    for f in _tool_files(dirs):
        mod = _module_for(f)
        if mod is not None:
            for k, v in tools_in_module(mod).items():
                found.setdefault(k, v)
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise KeyError(
                f"unknown tool(s) {missing} in --tools; available: "
                f"{sorted(set(found) | set(plugins.plugins))} (a tool is a BaseTool "
                "subclass in tool_server/tools/, a --tool-dir, or an installed package's "
                f"{TOOLS_GROUP!r} entry point; see python -m tool_server --list-tools)"
            )
        return {n: found[n] for n in names}
    for k, obj in plugins.load_all().items():
        found.setdefault(k, cast("type[BaseTool]", obj))  # checked by _check_tool
    return found


@dataclass(frozen=True)
class ToolListing:
    """One row of ``python -m tool_server --list-tools``."""

    name: str
    source: str  # "built-in", "--tool-dir DIR" or "package NAME VERSION"
    usage: str  # the tool's usage line, or what is wrong with it
    ok: bool


def list_tools(tool_dirs: Iterable[str] = ()) -> list[ToolListing]:
    """Every tool this server could serve, and every tool file or plugin that cannot be
    used (with its problem), sorted by name. Imports every tool file and plugin."""
    dirs = [Path(d).resolve() for d in tool_dirs] + [BUILTIN_TOOL_DIR]
    rows: list[ToolListing] = []
    served: set[str] = set()
    for f in _tool_files(dirs):
        mod = _module_for(f)
        if mod is None:
            rows.append(ToolListing(f.stem, _dir_source(f.parent), "failed to import", False))
        for k, v in tools_in_module(mod).items() if mod is not None else ():
            if k not in served:  # the first folder wins, as in discover_tools
                served.add(k)
                rows.append(ToolListing(k, _dir_source(f.parent), v.usage, True))
    plugins = tool_plugins()
    loaded = cast("dict[str, type[BaseTool]]", plugins.load_all())  # checked by _check_tool
    for name in plugins.names():
        if name in loaded and name not in served:
            rows.append(ToolListing(name, plugins.source(name), loaded[name].usage, True))
        elif name in loaded:
            rows.append(
                ToolListing(name, plugins.source(name), "shadowed by a --tool-dir tool", False)
            )
        else:
            rows.append(ToolListing(name, plugins.source(name), plugins.problems[name], False))
    return sorted(rows, key=lambda r: (r.name, not r.ok))


def _dir_source(d: Path) -> str:
    return BUILTIN if d == BUILTIN_TOOL_DIR else f"--tool-dir {d}"
