"""The optimizer and its ``optimizer`` section live in :mod:`verltool_jax.algos.optimizer`
(so that ``run_config`` imports no ``train`` module); this name stays for
``train/trainer.py`` and ``tests/train/test_config.py``."""

from verltool_jax.algos.optimizer import OptimConfig, lr_schedule, make_optimizer, optimizer_config

__all__ = ["OptimConfig", "lr_schedule", "make_optimizer", "optimizer_config"]
