"""A reward plugin that imports in the parent but fails inside reward worker processes."""

import multiprocessing

if multiprocessing.current_process().name != "MainProcess":
    raise ImportError("plugin needs a GPU the workers do not have")
