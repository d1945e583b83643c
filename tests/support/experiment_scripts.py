"""Load a script under experiments/ as a module (they are scripts, not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_experiment(name: str):
    """``experiments/<name>.py`` imported as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
