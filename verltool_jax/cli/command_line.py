"""Parse an entry point's argv: ``--config file.py[:arg]``, ``--config.k=v``, own flags.

Everything is checked before any work starts: the file loads, every override names an
existing field and parses as its type, the result passes :func:`validate_config`, and
any other flag is one the entry point declared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import ml_collections

from verltool_jax.cli.config_loader import ConfigError, load_config
from verltool_jax.cli.overrides import apply_overrides
from verltool_jax.cli.validate import validate_config


@dataclass
class CommandLine:
    """The parsed command line: the final config, its source, and the other flags."""

    config: ml_collections.ConfigDict
    config_spec: str
    overrides: list[tuple[str, str]] = field(default_factory=list)
    flags: dict[str, str] = field(default_factory=dict)


def _split_flag(argv: Sequence[str], i: int) -> tuple[str, str | None, int]:
    """(name, value or None, next index) of the flag at ``argv[i]`` (``--a=b`` or ``--a b``)."""
    arg = argv[i]
    name, eq, value = arg[2:].partition("=")
    if eq:
        return name, value, i + 1
    if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
        return name, argv[i + 1], i + 2
    return name, None, i + 1


def parse_command_line(
    argv: Sequence[str], flags: Mapping[str, str | None] | None = None, validate: bool = True
) -> CommandLine:
    """Parse ``argv`` (without the program name).

    ``flags`` maps the entry point's own flag names to defaults (``None``: required).
    A boolean flag may be given bare (``--dry_run`` -> "true"). Raises
    :class:`ConfigError` for a missing ``--config``, unknown flags, unknown or ill-typed
    overrides, or a config that fails validation.
    """
    declared = dict(flags or {})
    spec: str | None = None
    overrides: list[tuple[str, str]] = []
    given: dict[str, str] = {}
    i = 0
    while i < len(argv):
        if not argv[i].startswith("--"):
            raise ConfigError(f"unexpected argument {argv[i]!r}; flags look like --name=value")
        name, value, i = _split_flag(argv, i)
        if name == "config":
            if value is None:
                raise ConfigError("--config needs a file, e.g. --config configs/tiny_math.py")
            spec = value
        elif name.startswith("config."):
            if value is None:
                raise ConfigError(f"--{name} needs a value: --{name}=VALUE")
            overrides.append((name[len("config.") :], value))
        elif name in declared:
            given[name] = "true" if value is None else value
        else:
            known = ", ".join(["--config", "--config.<key>"] + [f"--{k}" for k in declared])
            raise ConfigError(f"unknown flag --{name}; known flags: {known}")
    if spec is None:
        raise ConfigError("missing --config, e.g. --config configs/tiny_math.py[:arg]")
    missing = [k for k, v in declared.items() if v is None and k not in given]
    if missing:
        raise ConfigError(f"missing required flag(s): {', '.join('--' + k for k in missing)}")
    config = load_config(spec)
    apply_overrides(config, overrides)
    if validate:
        validate_config(config)
    out = {k: v for k, v in declared.items() if v is not None}
    out.update(given)
    return CommandLine(config=config, config_spec=spec, overrides=overrides, flags=out)
