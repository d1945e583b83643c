"""What the user sees while a run works: the trainer's own lines and its progress bar on
the console; everything the libraries print (vLLM, torch, XLA, the tool server's
subprocesses: INFO and WARNING lines, C++ logs) goes to ``<out_dir>/run.log``. The
console says where that file is, and shows its last lines when the run fails.

:func:`console` is the stream the trainer prints to: the real terminal while
:func:`run_logged` redirects file descriptors 1 and 2 to the log, else ``sys.stdout``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO, TypeVar

T = TypeVar("T")

_console: TextIO | None = None
TAIL_LINES = 40
CONSOLE = {"console": True}  # ``log.info(line, extra=CONSOLE)``: an untagged console line


def console() -> TextIO:
    """Where the trainer's own lines go."""
    return _console if _console is not None else sys.stdout


@contextlib.contextmanager
def library_output_to(log_path: Path) -> Iterator[TextIO]:
    """Redirect fds 1 and 2 (and Python's logging, INFO and up, written to the log file
    itself so that a replaced ``sys.stderr`` cannot divert it) to ``log_path``; yields
    the console. The root logger's handlers and level are restored on the way out."""
    global _console
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    term = os.fdopen(os.dup(1), "w", buffering=1)
    log_file = open(log_path, "a", buffering=1)
    os.dup2(log_file.fileno(), 1)
    os.dup2(log_file.fileno(), 2)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for h in saved_handlers:
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    _console = term
    try:
        yield term
    finally:
        _console = None
        root.removeHandler(handler)
        with contextlib.suppress(OSError):
            handler.flush()
        for h in saved_handlers:
            root.addHandler(h)
        root.setLevel(saved_level)
        # the log's disk may be full: the console comes back all the same
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):
                f.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        with contextlib.suppress(OSError):
            log_file.close()
        term.close()


def tail(path: Path, n: int = TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def log_name(env=None) -> str:
    """``run.log``, or ``run.process<i>.log`` for process i > 0 of a multi-host run."""
    pid = int((os.environ if env is None else env).get("JAX_PROCESS_ID") or 0)
    return "run.log" if pid == 0 else f"run.process{pid}.log"


def run_logged(config, fn: Callable[[], T]) -> T:
    """Run ``fn`` with library output in ``<trainer.out_dir>/run.log``; on failure print
    the log's last lines and the error to the console, then re-raise. Process i > 0 of a
    multi-host run (``JAX_PROCESS_ID``) logs to ``run.process<i>.log``."""
    log_path = Path(config.trainer.out_dir) / log_name()
    with library_output_to(log_path) as term:
        print(f"[trainer] library logs (vLLM, XLA, tool server) go to {log_path}", file=term)
        try:
            return fn()
        except BaseException as e:
            if not isinstance(e, SystemExit):
                try:
                    traceback.print_exc()  # into the log, with the rest
                except OSError:  # the log's disk may be the full one
                    pass
                print(
                    f"[trainer] failed: {type(e).__name__}: {e}\n--- last lines of "
                    f"{log_path} ---\n{tail(log_path)}\n---",
                    file=term,
                )
            raise


class ConsoleHandler(logging.Handler):
    """Writes the project's own ``[tag] ...`` lines (INFO and up, from the ``verltool_jax``
    loggers; an untagged one with ``extra=CONSOLE``) to :func:`console`, message only. All
    project lines also propagate to the root logger (the run's log file), where the other
    project lines go only."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.addFilter(lambda r: getattr(r, "console", False) or r.getMessage().startswith("["))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = console()
            stream.write(record.getMessage() + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def console_lines(enabled: bool = True) -> Iterator[None]:
    """Show the project's ``[tag]`` lines on the console while inside (entry points:
    :func:`verltool_jax.train.trainer.train`, :func:`verltool_jax.eval.evaluate`). The
    ``verltool_jax`` logger is set to INFO so its lines reach the handlers; with
    ``enabled=False`` (a quiet call, process i > 0) they reach only the run's log file."""
    project = logging.getLogger("verltool_jax")
    saved_level = project.level
    handler = ConsoleHandler() if enabled else None
    if project.getEffectiveLevel() > logging.INFO:
        project.setLevel(logging.INFO)
    if handler is not None:
        project.addHandler(handler)
    try:
        yield
    finally:
        if handler is not None:
            project.removeHandler(handler)
        project.setLevel(saved_level)
