"""Semantic checks of a loaded config, run before any work starts: the config must
build a typed :class:`~verltool_jax.run_config.RunConfig` (every allowed value and range
lives there); every problem is reported at once as one :class:`ConfigError`."""

from __future__ import annotations

import ml_collections

from verltool_jax.run_config import RunConfig, run_config_from_dict


def validate_config(config: ml_collections.ConfigDict) -> RunConfig:
    """The typed run config of ``config``; raises ``ConfigError`` naming every bad key."""
    return run_config_from_dict(config)
