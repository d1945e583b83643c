"""Start-up's pieces: the compilation cache folder (where, per JAX version, off), a
second compilation read back from it, and the clock's split of the first step."""

from __future__ import annotations

import logging
import time

import jax
import jax.numpy as jnp
import pytest

from verltool_jax.run_config import TrainerSection
from verltool_jax.train import startup


@pytest.fixture
def restore_jax_cache():
    """JAX's cache settings as they were (the test process compiles without one)."""
    keys = (
        "jax_enable_compilation_cache",
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
    )
    before = {k: getattr(jax.config, k) for k in keys}
    yield
    for k, v in before.items():
        jax.config.update(k, v)
    from jax.experimental.compilation_cache import compilation_cache as cc

    cc.reset_cache()


def test_cache_folder_is_beside_the_run_per_jax_version_and_can_be_turned_off(tmp_path):
    out = tmp_path / "runs" / "a"
    path = startup.compilation_cache_dir(TrainerSection(out_dir=str(out)))
    assert path is not None and path.parent == tmp_path / "runs" / ".jax_cache"
    assert path.name.startswith(f"jax-{jax.__version__}-xla-")
    given = startup.compilation_cache_dir(
        TrainerSection(out_dir=str(out), compilation_cache_dir=str(tmp_path / "c"))
    )
    assert given is not None and given.parent == tmp_path / "c"
    assert startup.compilation_cache_dir(TrainerSection(compilation_cache=False)) is None


def test_xla_flags_get_their_own_folder(tmp_path, monkeypatch):
    t = TrainerSection(out_dir=str(tmp_path / "a"))
    monkeypatch.setenv("XLA_FLAGS", "")
    plain = startup.compilation_cache_dir(t)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert startup.compilation_cache_dir(t) != plain


def _fresh_compile(scale: float) -> None:
    """Compile (not from JAX's in-memory caches) and run a small function."""
    jax.clear_caches()
    jax.jit(lambda x: jnp.tanh(x @ x.T) * scale)(jnp.ones((16, 16))).block_until_ready()


def test_a_second_compilation_is_read_from_the_cache(tmp_path, restore_jax_cache, monkeypatch):
    monkeypatch.setattr(startup, "CACHE_MIN_COMPILE_S", 0.0)  # cache even a fast one
    folder = startup.compilation_cache_dir(TrainerSection(out_dir=str(tmp_path / "run")))
    assert folder is not None
    startup.use_compilation_cache(folder)
    clock = startup.StartupClock()
    _fresh_compile(3.0)
    written = sorted(p.name for p in folder.iterdir())
    assert written and startup.COMPILES.misses > clock.misses0  # compiled and written
    _fresh_compile(3.0)
    assert startup.COMPILES.hits > clock.hits0  # read back
    assert sorted(p.name for p in folder.iterdir()) == written  # nothing new written
    # Off: nothing is read or written any more.
    startup.use_compilation_cache(None)
    hits = startup.COMPILES.hits
    _fresh_compile(4.0)
    _fresh_compile(4.0)
    assert startup.COMPILES.hits == hits
    assert sorted(p.name for p in folder.iterdir()) == written


def test_clock_splits_the_time_to_the_first_step(caplog):
    caplog.set_level(logging.INFO)
    clock = startup.StartupClock(t0=time.perf_counter() - 10.0)
    clock.add("imports", 2.0)
    clock.add("model", 3.0)
    clock.background["engine"] = 6.0
    now = time.perf_counter()
    jax.clear_caches()
    t0 = time.perf_counter()
    jax.jit(lambda x: x * 7.0 + 1.0)(jnp.ones(3)).block_until_ready()  # a compilation
    t1 = time.perf_counter()
    metrics = clock.first_step(now, {"time/train_s": (t0, t1)})
    assert metrics["startup/imports_s"] == 2.0 and metrics["startup/model_s"] == 3.0
    assert metrics["startup/other_s"] == pytest.approx(5.0, abs=0.05)
    assert metrics["startup/engine_background_s"] == 6.0
    compiled = metrics["startup/compile_train_step_s"]
    assert 0 < compiled <= t1 - t0
    assert metrics["startup/to_first_step_s"] == pytest.approx(10.0 + compiled, abs=0.05)
    assert clock.result == {k.removeprefix("startup/"): v for k, v in metrics.items()}
    line = next(r.getMessage() for r in caplog.records if "start-up" in r.getMessage())
    assert line.startswith("[trainer] start-up ") and "imports 2.0, model 3.0, other 5.0" in line
    assert "engine (background) 6.0" in line and "compilation cache off" in line


def test_background_work_is_waited_for_and_its_error_raised():
    clock = startup.begin()
    try:
        done = startup.Background("engine", lambda: time.sleep(0.2) or "sampler")
        assert done.result() == "sampler" and done.taken
        assert clock.background["engine"] >= 0.2 and "engine (waited)" in clock.parts
        closed: list = []
        left = startup.Background("engine", lambda: "unused")
        left.close(closed.append)
        assert closed == ["unused"]  # nobody took it: closed

        def fail():
            raise ValueError("no engine")

        with pytest.raises(ValueError, match="no engine"):
            startup.Background("engine", fail).result()
    finally:
        startup.end()


def test_process_start_is_before_now():
    assert startup.process_start() < time.perf_counter()


@pytest.mark.slow  # builds a tiny model (torch, a tokenizer): 10-30 s
def test_a_tiny_model_is_built_once_and_copied_into_the_next_run(tmp_path, monkeypatch):
    from verltool_jax.cli import parse_command_line
    from verltool_jax.run_config import run_config_from_dict
    from verltool_jax.train import build

    def rc(name: str, *overrides: str):
        argv = ["--config", "configs/tiny_math.py:smoke"]
        argv += [f"--config.trainer.out_dir={tmp_path / 'runs' / name}"]
        return run_config_from_dict(parse_command_line(argv + list(overrides)).config)

    first = build.prepare_model_dir(rc("a"), tmp_path / "runs" / "a")
    kept = build.tiny_model_cache(rc("a"))
    assert kept is not None and kept.parent == tmp_path / "runs" / ".jax_cache"
    files = sorted(p.name for p in first.iterdir())
    assert sorted(p.name for p in kept.iterdir()) == files

    def no_build(*_):
        raise AssertionError("built again")

    monkeypatch.setattr(build, "_build_tiny", no_build)
    second = build.prepare_model_dir(rc("b"), tmp_path / "runs" / "b")
    assert second != first and sorted(p.name for p in second.iterdir()) == files
    for name in files:
        assert (second / name).read_bytes() == (first / name).read_bytes()
    # Other sizes, another model; the cache off, none kept.
    assert build.tiny_model_cache(rc("c", "--config.model.tiny.hidden_size=32")) != kept
    assert build.tiny_model_cache(rc("d", "--config.trainer.compilation_cache=false")) is None


def test_the_entry_points_import_light():
    """vLLM's engine core is a spawned process that re-imports the main module of the
    command (``python -m verltool_jax.train`` etc.): that import must not pull in JAX
    (2 s on the engine's start, which is start-up's longest path)."""
    import subprocess
    import sys

    code = (
        "import sys, verltool_jax.train.__main__, verltool_jax.eval, verltool_jax.passrate; "
        "print(sorted(m for m in ('jax', 'flax', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
