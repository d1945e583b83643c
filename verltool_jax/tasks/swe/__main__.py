"""``python -m verltool_jax.tasks.swe``: see :func:`verltool_jax.tasks.swe.task.main`."""

import sys

from verltool_jax.tasks.swe.task import main

if __name__ == "__main__":
    sys.exit(main())
