"""``python -m verltool_jax.train --config configs/<file>.py[:arg] [--config.key=value ...]``

Exit codes: 0 done, 2 bad config or command line, 3 a dependency (tool server, sampler)
went down for good (the last good checkpoint is kept; fix it and rerun the same command to
resume), 130 interrupted (SIGINT/SIGTERM; the checkpoint is saved and the same command
resumes), 1 any other failure.
"""
from __future__ import annotations

import sys

from verltool_jax.cli import ConfigError, parse_command_line

EXIT_DEPENDENCY_DOWN = 3
EXIT_INTERRUPTED = 130


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cl = parse_command_line(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from verltool_jax.train.console import run_logged
    from verltool_jax.train.health import DependencyDown
    from verltool_jax.train.trainer import train
    try:
        result = run_logged(cl.config, lambda: train(cl.config))
    except DependencyDown:          # run_logged has printed the reason on the console
        return EXIT_DEPENDENCY_DOWN
    return EXIT_INTERRUPTED if result.summary.get("interrupted") else 0


if __name__ == "__main__":
    from verltool_jax.malloc_tuning import reexec_with_hugepages
    reexec_with_hugepages()
    sys.exit(main())
