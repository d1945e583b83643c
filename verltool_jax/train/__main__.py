"""``python -m verltool_jax.train --config configs/<file>.py[:arg] [--config.key=value ...]``"""
from __future__ import annotations

import logging
import sys

from verltool_jax.cli import ConfigError, parse_command_line


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cl = parse_command_line(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    from verltool_jax.train.trainer import train
    train(cl.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
