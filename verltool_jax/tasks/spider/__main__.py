"""``python -m verltool_jax.tasks.spider``: see :func:`verltool_jax.tasks.spider.task.main`."""

import sys

from verltool_jax.tasks.spider.task import main

if __name__ == "__main__":
    sys.exit(main())
