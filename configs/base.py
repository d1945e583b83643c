"""Shared defaults of every experiment: every section of ``verltool_jax.run_config`` at
its defaults (that module is the one source of truth for defaults and allowed values).

An experiment file starts from ``base.get_config()`` and changes what it needs:

    from configs import base
    def get_config(arg=""):
        config = base.get_config()
        config.rollout.max_turns = 2
        return config

Every field is overridable from the command line (``--config.rollout.max_turns=3``);
the field's type in ``run_config`` is the type an override must parse as.
"""

from __future__ import annotations

import ml_collections

from verltool_jax.run_config import default_config_dict


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """The base config (``arg`` unused)."""
    return default_config_dict()
