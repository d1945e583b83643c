"""Environments across frameworks (docs/environments.md).

* :mod:`verltool_jax.environments.openenv_server`: any task of ours served as an OpenEnv
  environment (reset / step over OpenEnv's HTTP and WebSocket protocol), its tools run by
  our tool server and its reward by our reward functions.

The other direction, an OpenEnv environment driven by our agent loop, is the ``openenv``
tool (``tool_server/tools/openenv.py``), the ``openenv`` task
(``verltool_jax/tasks/openenv_task.py``) and the ``env_reward`` reward.

OpenEnv is an optional dependency: ``pip install verltool-jax[openenv]``.
"""

from __future__ import annotations

OPENENV_EXTRA = "openenv"  # the pip extra (requirements-openenv.txt) these modules need


def require_openenv() -> None:
    """ImportError naming the extra when ``openenv-core`` is not installed."""
    try:
        import openenv.core  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"OpenEnv support needs the openenv-core package: pip install "
            f"'verltool-jax[{OPENENV_EXTRA}]' (or -r requirements-openenv.txt); {e}"
        ) from e
