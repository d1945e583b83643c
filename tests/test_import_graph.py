"""The import graph of ``verltool_jax/`` and ``tool_server/`` (module-level and
function-local imports alike) has no cycle between packages and follows the layering of
``docs/architecture.md`` (``## Layers``). The checker itself is tested on planted
cycles and upward edges, so a passing run means something."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.support.import_graph import (
    Edge,
    check,
    cycle_problems,
    imports_of,
    layer_problems,
    read_layers,
    strongly_connected,
    unit_graph,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_project_has_no_cycle_and_keeps_its_layers():
    problems = check(ROOT)
    assert not problems, "\n".join(problems)


def test_every_layer_names_units_and_the_entry_points_are_on_top():
    layers = read_layers(ROOT / "docs" / "architecture.md")
    assert all(layers), "a layer names no unit in backticks"
    assert "verltool_jax.eval" in layers[0]
    flat = [u for layer in layers for u in layer]
    assert len(flat) == len(set(flat)), "a unit is in two layers"


def test_strongly_connected_components():
    g = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": ["e"]}
    assert strongly_connected(g) == [["a", "b", "c"]]
    assert strongly_connected({"a": ["b"], "b": []}) == []


def test_function_local_and_relative_imports_are_edges(tmp_path):
    pkg = tmp_path / "verltool_jax" / "tasks"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import y\n"
        "if TYPE_CHECKING:\n"
        "    from ..train import z\n"
        "def f():\n"
        "    import verltool_jax.run_config\n"
    )
    known = {"verltool_jax.tasks.y", "verltool_jax.train.z"}
    dsts = {(e.dst, e.line) for e in imports_of("verltool_jax.tasks.x", src, known)}
    assert {
        ("verltool_jax.tasks.y", 2),
        ("verltool_jax.train.z", 4),
        ("verltool_jax.run_config", 6),
    } <= dsts


def _plant(tmp_path: Path) -> Path:
    """A copy of the two packages' sources and of the architecture page."""
    for top in ("verltool_jax", "tool_server"):
        for src in (ROOT / top).rglob("*.py"):
            dst = tmp_path / src.relative_to(ROOT)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "architecture.md", tmp_path / "docs" / "architecture.md")
    return tmp_path


def test_a_planted_function_local_cycle_fails(tmp_path):
    root = _plant(tmp_path)
    before = set(check(root))
    # models <- rollout already (the agent loop reads the model config): close the loop
    models = root / "verltool_jax" / "models" / "config.py"
    models.write_text(
        models.read_text() + "\n\ndef _planted():\n    from verltool_jax.rollout import queue\n"
    )
    new = [p for p in check(root) if p not in before]
    print("\n".join(new))  # the note of issue 34 quotes this output
    cycles = [p for p in new if p.startswith("import cycle")]
    assert len(cycles) == 1
    assert cycles[0].startswith("import cycle between verltool_jax.models, verltool_jax.rollout")
    assert (
        "verltool_jax.models -> verltool_jax.rollout: verltool_jax/models/config.py:" in (cycles[0])
    )
    assert "verltool_jax.rollout -> verltool_jax.models: verltool_jax/rollout/" in cycles[0]
    assert any(
        re.match(r"verltool_jax.models \(layer \d+\) imports verltool_jax.rollout", p) for p in new
    )


def test_an_upward_edge_without_a_cycle_fails_and_a_new_unit_must_be_placed():
    e = Edge("tool_server.kit.tags", "verltool_jax.rewards.base", "kit/tags.py", 3)
    e2 = Edge("verltool_jax.newpkg.m", "verltool_jax.models.config", "newpkg/m.py", 1)
    graph = unit_graph([e, e2])
    assert cycle_problems(graph) == []
    layers = [["verltool_jax.rewards"], ["verltool_jax.models"], ["tool_server.kit"]]
    problems = layer_problems(graph, layers)
    assert problems == [
        "verltool_jax.newpkg is in no layer of docs/architecture.md (## Layers): add it",
        "tool_server.kit (layer 3) imports verltool_jax.rewards (layer 1, above it): kit/tags.py:3",
    ]
