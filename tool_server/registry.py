"""Tool discovery: every ``*.py`` file in ``tool_server/tools/`` (and in any extra
``--tool-dir``) that defines a :class:`BaseTool` subclass with a ``name`` is a tool.
Files whose name starts with ``_`` (helpers) and ``base.py`` are skipped.

Lookup is lazy: for a requested name the file ``<name>.py`` is tried first, and the
rest of the folder is imported only when that does not define it, so starting a server
for two tools does not import every other tool's heavy dependencies.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from tool_server.kit.base import BaseTool

log = logging.getLogger("tool_server.registry")

BUILTIN_TOOL_DIR = Path(__file__).resolve().parent / "tools"


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


def tools_in_module(module: ModuleType) -> dict[str, type]:
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


def discover_tools(
    names: list[str] | None = None, tool_dirs: Iterable[str] = ()
) -> dict[str, type]:
    """Find tool classes. With ``names``, return exactly those (raising ``KeyError``
    naming the missing ones and the available ones); without, every tool found."""
    dirs = [Path(d).resolve() for d in tool_dirs] + [BUILTIN_TOOL_DIR]
    for d in dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"tool directory {str(d)!r} does not exist (--tool-dir)")
    found: dict[str, type] = {}
    if names:
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
                f"unknown tool(s) {missing} in --tools; available: {sorted(found)} "
                "(a tool is a BaseTool subclass in tool_server/tools/ or a --tool-dir)"
            )
        return {n: found[n] for n in names}
    return found
