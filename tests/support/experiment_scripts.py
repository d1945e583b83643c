"""Load a script under experiments/ or benchmarks/ as a module (they are scripts, not a
package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_script(folder: str, name: str):
    """``<folder>/<name>.py`` of the repository imported as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_experiment(name: str):
    """``experiments/<name>.py`` imported as the module ``name``."""
    return load_script("experiments", name)
