"""Load an experiment config: ``path/to/file.py[:arg]`` -> locked ``ConfigDict``.

The file is plain Python defining ``get_config(arg: str = "")`` (big_vision style: one
file is a family of configs selected by ``arg``). It is imported by path under a
private module name, so loading never touches absl flags or other global state.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import ml_collections

from verltool_jax.run_config import ConfigError


def split_spec(spec: str) -> tuple[Path, str | None]:
    """``"configs/x.py:sync"`` -> (Path("configs/x.py"), "sync"); no colon -> arg None."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError("--config needs a file, e.g. --config configs/tiny_math.py[:arg]")
    path, sep, arg = spec.partition(".py:")
    if sep:
        return Path(path + ".py"), arg
    return Path(spec), None


def _import_file(path: Path):
    """Import ``path`` as a fresh module; its folder's parent is importable meanwhile.

    So ``configs/x.py`` may ``from configs import base`` wherever it is run from.
    """
    name = f"_verltool_config_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--config: cannot import {path} (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    root = str(path.resolve().parent.parent)
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        spec.loader.exec_module(module)
    finally:
        if added:
            sys.path.remove(root)
    return module


def load_config(spec: str, lock: bool = True) -> ml_collections.ConfigDict:
    """Load ``file.py[:arg]``: import the file and return ``get_config(arg)``, locked.

    A file whose ``get_config`` takes no argument can only be loaded without ``:arg``.
    """
    path, arg = split_spec(spec)
    if not path.is_file():
        raise ConfigError(
            f"--config: file {str(path)!r} does not exist "
            "(give a path such as configs/tiny_math.py)"
        )
    module = _import_file(path)
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigError(f"--config: {path} defines no get_config(arg) function")
    takes_arg = len(inspect.signature(get_config).parameters) > 0
    if arg is not None and not takes_arg:
        raise ConfigError(
            f"--config: {path}:get_config() takes no argument, but ':{arg}' was given"
        )
    config = get_config(arg if arg is not None else "") if takes_arg else get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(
            f"--config: {path}:get_config returned {type(config).__name__}, "
            "expected an ml_collections.ConfigDict"
        )
    if lock:
        config.lock()
    return config
