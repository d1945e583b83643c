"""The ``algo`` section lives in :mod:`verltool_jax.algos.config` (beside what it
configures, so that ``run_config`` imports no ``train`` module); this name stays for
``tests/train/test_config.py``."""

from verltool_jax.algos.config import AlgoConfig, algo_choices, algo_config

__all__ = ["AlgoConfig", "algo_choices", "algo_config"]
