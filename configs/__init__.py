"""Experiment configs: one file per family, each with ``get_config(arg)``."""
