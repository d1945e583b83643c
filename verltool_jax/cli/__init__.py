"""Command-line plumbing shared by the entry points (train, eval).

``parse_command_line(argv)`` turns ``--config configs/x.py:arg --config.a.b=3`` into a
locked, validated ``ml_collections.ConfigDict`` before any work starts.
"""

from verltool_jax.cli.command_line import CommandLine, parse_command_line
from verltool_jax.cli.config_loader import ConfigError, load_config
from verltool_jax.cli.overrides import apply_overrides, parse_value
from verltool_jax.cli.validate import validate_config

__all__ = [
    "CommandLine",
    "ConfigError",
    "apply_overrides",
    "load_config",
    "parse_command_line",
    "parse_value",
    "validate_config",
]
