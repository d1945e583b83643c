"""``python -m verltool_jax.train --config configs/<file>.py[:arg] [--config.key=value ...]``

Exit codes: 0 done, 2 bad config or command line, 3 a dependency (tool server, sampler)
went down for good (the last good checkpoint is kept; fix it and rerun the same command to
resume), 4 the disk of ``trainer.out_dir`` is full, or too small for one checkpoint at the
start (the last complete checkpoint is intact; free space and rerun to resume), 130
interrupted (SIGINT/SIGTERM; the checkpoint is saved and the same command resumes), 1 any
other failure.
"""

from __future__ import annotations

import sys

# Light at import: vLLM's engine core, spawned, re-imports the main module (2 s with JAX).
from verltool_jax.schema import ConfigError

EXIT_DEPENDENCY_DOWN = 3
EXIT_DISK_FULL = 4
EXIT_INTERRUPTED = 130


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        from verltool_jax.cli import parse_command_line

        cl = parse_command_line(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from verltool_jax.samplers.torchvision_cpu import prepare_vision_language_sampler

    prepare_vision_language_sampler(cl.config)
    from verltool_jax.runtime.console import run_logged
    from verltool_jax.samplers.base import SamplerDeadError
    from verltool_jax.train.disk import disk_full_message, is_disk_full
    from verltool_jax.train.health import DependencyDown
    from verltool_jax.train.startup import process_start
    from verltool_jax.train.trainer import train

    started_at = process_start()  # start-up counts the imports from the command on
    try:
        result = run_logged(cl.config, lambda: train(cl.config, started_at=started_at))
    except (DependencyDown, SamplerDeadError):  # run_logged has printed the reason
        # SamplerDeadError escapes the health checks when a weight sync finds the engine
        # dead past its restart budget (samplers/restart.py)
        return EXIT_DEPENDENCY_DOWN
    except Exception as e:
        if not is_disk_full(e):
            raise
        try:  # the console may be a file on the full disk: the exit code says it anyway
            print(disk_full_message(e, cl.config.trainer.out_dir), file=sys.stderr, flush=True)
        except OSError:
            pass
        return EXIT_DISK_FULL
    return EXIT_INTERRUPTED if result.summary.interrupted else 0


if __name__ == "__main__":
    from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()
    sys.exit(main())
