"""Start-up: the wall time from the command to the first RL step, split into its parts,
and the persistent compilation cache that cuts its compilations on a second run.

:class:`StartupClock` is made by ``trainer.train`` and made the active clock; the places
that build the run time their part with :func:`part` (a no-op without an active clock,
e.g. in ``eval``). Parts on the critical path (``parts``) add up, with ``other``, to the
wall time before the first step; work started in the background (the sampler engines,
``background``) is listed with its own duration and the time the run waited for it.
The first RL step compiles the log-prob pass (the sampler parity) and the train step:
those compilations (JAX's trace, lowering and XLA compile events, attributed by the step
timer's phases) are counted into start-up too. After the first step, one console line
says it all and the figures go to that step's metrics (``startup/*``) and to
``summary.json`` (``startup``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verltool_jax import metric_names as names

log = logging.getLogger(__name__)

# JAX's monitoring events whose durations make up a compilation (trace to jaxpr, lower
# to StableHLO, XLA compile or persistent-cache read).
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"
# Compilations at least this long are written to the persistent cache. JAX's default,
# 1 s, leaves out the many small ones of a model load and of eager passes (one per op
# and shape; 0.05-0.3 s each on a busy CPU); reading one back costs milliseconds.
CACHE_MIN_COMPILE_S = 0.02
# The step timer's phases whose compilations count as start-up, and their names.
FIRST_STEP_COMPILES = {names.TIME_PARITY: "log-prob pass", names.TIME_TRAIN: "train step"}


class _CompileEvents:
    """Every compilation's (end time, seconds) and the persistent-cache hits and misses
    of this process, from JAX's monitoring listeners (registered once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.durations: list[tuple[float, float]] = []
        self.hits = 0
        self.misses = 0
        self.registered = False

    def register(self) -> None:
        with self.lock:
            if self.registered:
                return
            self.registered = True
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._duration)
        jax.monitoring.register_event_listener(self._event)

    def _duration(self, event: str, duration_secs: float, **_: str | int) -> None:
        if event in COMPILE_EVENTS:
            with self.lock:
                self.durations.append((time.perf_counter(), float(duration_secs)))

    def _event(self, event: str, **_: str | int) -> None:
        with self.lock:
            if event == CACHE_HIT_EVENT:
                self.hits += 1
            elif event == CACHE_MISS_EVENT:
                self.misses += 1

    def seconds_between(self, t0: float, t1: float) -> float:
        """Compilation seconds that ended within [t0, t1] (perf_counter times)."""
        with self.lock:
            return sum(s for t, s in self.durations if t0 <= t <= t1)


COMPILES = _CompileEvents()


def process_start() -> float:
    """The ``time.perf_counter()`` value of this process's start (the command; a process
    that re-executes itself keeps its start), so imports count into start-up."""
    import psutil

    return time.perf_counter() - (time.time() - psutil.Process().create_time())


@dataclass
class StartupClock:
    """The parts of one run's start-up (module docstring). ``t0``: the ``perf_counter``
    time it counts from (the command, or when the clock was made)."""

    t0: float = field(default_factory=time.perf_counter)
    parts: dict[str, float] = field(default_factory=dict)  # critical path, wall s
    background: dict[str, float] = field(default_factory=dict)  # overlapped work, wall s
    cache_dir: Path | None = None
    hits0: int = 0
    misses0: int = 0
    result: dict[str, float] = field(default_factory=dict)  # set after the first step

    def __post_init__(self) -> None:
        COMPILES.register()
        self.hits0, self.misses0 = COMPILES.hits, COMPILES.misses

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def first_step(self, step_start: float, spans: dict[str, tuple[float, float]]) -> dict:
        """The split once the first RL step has run (it started at ``step_start``; its
        timer's phase ``spans``): logs the line, keeps and returns ``startup/*`` metrics."""
        before = step_start - self.t0
        r = {f"{k}_s": v for k, v in self.parts.items()}
        r["other_s"] = max(0.0, before - sum(self.parts.values()))
        r.update({f"{k} (background)_s": v for k, v in self.background.items()})
        compiled = 0.0
        for phase, name in FIRST_STEP_COMPILES.items():
            if phase in spans:
                s = COMPILES.seconds_between(*spans[phase])
                r[f"compile {name}_s"], compiled = s, compiled + s
        r["compile before the step_s"] = COMPILES.seconds_between(self.t0, step_start)
        r["cache_hits"] = float(COMPILES.hits - self.hits0)
        r["cache_misses"] = float(COMPILES.misses - self.misses0)
        r["to_first_step_s"] = before + compiled
        self.result = {k.replace(" ", "_").replace("(", "").replace(")", ""): v
                       for k, v in r.items()}  # fmt: skip
        log.info(f"[trainer] {self.line(r)}")
        return {f"startup/{k}": v for k, v in self.result.items()}

    def line(self, r: dict[str, float]) -> str:
        """``start-up 41.2 s to the first RL step: imports 5.1, ...; cache ...``."""
        skip = {"to_first_step_s", "cache_hits", "cache_misses"}
        shown = [(k[:-2], v) for k, v in r.items() if k not in skip]
        parts = ", ".join(f"{k} {v:.1f}" for k, v in shown if not k.startswith("compile "))
        compiles = ", ".join(f"{k[8:]} {v:.1f}" for k, v in shown if k.startswith("compile "))
        cache = (
            f"compilation cache {self.cache_dir}: {r['cache_hits']:.0f} hits, "
            f"{r['cache_misses']:.0f} misses"
            if self.cache_dir is not None
            else "compilation cache off"
        )
        return (
            f"start-up {r['to_first_step_s']:.1f} s to the first RL step: {parts}; "
            f"compilation {compiles}; {cache}"
        )


_ACTIVE: StartupClock | None = None


def begin(t0: float | None = None) -> StartupClock:
    """Make a clock counting from ``t0`` (the command, whose imports then count as the
    part ``imports``; now if None) the active one."""
    global _ACTIVE
    _ACTIVE = StartupClock() if t0 is None else StartupClock(t0=t0)
    if t0 is not None:
        _ACTIVE.add("imports", time.perf_counter() - t0)
    return _ACTIVE


def end() -> dict[str, float]:
    """Stop the active clock; its figures (empty when no RL step ran)."""
    global _ACTIVE
    result = _ACTIVE.result if _ACTIVE is not None else {}
    _ACTIVE = None
    return result


def active() -> StartupClock | None:
    return _ACTIVE


def add(name: str, seconds: float) -> None:
    """Add ``seconds`` to the active clock's part ``name`` (nothing without one)."""
    if _ACTIVE is not None:
        _ACTIVE.add(name, seconds)


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """Time ``name`` on the active clock's critical path (nothing without one)."""
    clock = _ACTIVE
    if clock is None:
        yield
        return
    with clock.part(name):
        yield


class Background:
    """``fn()`` started on a daemon thread now; :meth:`result` waits for it (re-raising
    its error) and charges the wait to the active clock's part ``name``, the thread's own
    duration to its background parts."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name, self.seconds, self.taken = name, 0.0, False
        self._value: Any = None
        self._error: BaseException | None = None
        self._clock = _ACTIVE
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        t = time.perf_counter()
        try:
            self._value = fn()
        except BaseException as e:  # handed to the caller of result()
            self._error = e
        finally:
            self.seconds = time.perf_counter() - t
            if self._clock is not None:
                self._clock.background[self.name] = self.seconds

    def result(self) -> Any:
        """The value (its owner is now the caller) or the thread's error."""
        with part(f"{self.name} (waited)"):
            self._thread.join()
        if self._error is not None:
            raise self._error
        self.taken = True
        return self._value

    def close(self, closer: Callable[[Any], None]) -> None:
        """Wait for the thread, then ``closer(value)`` if it made one nobody took."""
        self._thread.join()
        if self._value is not None and not self.taken:
            closer(self._value)


def cache_base(trainer: Any) -> Path | None:
    """The folder of what a run keeps for the next (the one source of this default), or
    None with ``trainer.compilation_cache=False``: ``trainer.compilation_cache_dir`` or
    ``<out_dir>/../.jax_cache``."""
    if not trainer.compilation_cache:
        return None
    return Path(
        trainer.compilation_cache_dir or Path(trainer.out_dir).absolute().parent / ".jax_cache"
    )


def compilation_cache_dir(trainer: Any) -> Path | None:
    """Where the run's persistent compilation cache lives, or None when off: in
    :func:`cache_base`, a folder per JAX version and ``XLA_FLAGS`` (JAX's own key covers
    both; the folder keeps incompatible entries apart for a reader and for cleaning up)."""
    base = cache_base(trainer)
    if base is None:
        return None
    import jax

    flags = hashlib.sha256(os.environ.get("XLA_FLAGS", "").encode()).hexdigest()[:8]
    return base / f"jax-{jax.__version__}-xla-{flags}"


def set_up_compilation_cache(trainer: Any) -> Path | None:
    """:func:`use_compilation_cache` with the run's folder (:func:`compilation_cache_dir`
    of the ``trainer`` section), which the active clock reports; the folder or None."""
    path = compilation_cache_dir(trainer)
    use_compilation_cache(path)
    if _ACTIVE is not None:
        _ACTIVE.cache_dir = path
    return path


def use_compilation_cache(path: Path | None) -> None:
    """Point JAX's persistent compilation cache at ``path`` (made if missing), or turn it
    off (None); takes effect for the next compilation, also when an earlier run in this
    process used another folder."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", path is not None)
    jax.config.update("jax_compilation_cache_dir", None if path is None else str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_S)
    cc.reset_cache()
