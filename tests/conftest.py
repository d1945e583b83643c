"""Root of the tests: folders mirror the packages (tool_server/, models/, rollout/, ...).

Session fixtures shared across folders are pytest plugins in ``support/`` (one vLLM CPU
engine, the tiny tokenizer, a real tool server); plain helpers are ``support.*`` modules.
``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject.toml).
"""

pytest_plugins = ["support.samplers", "support.rollout_fixtures"]
