"""Semantic checks of a loaded config, run before any work starts.

Each rule names a dotted key and what it must be; a key the config does not have is
skipped (config families need not carry every section). Errors are collected and raised
together as one :class:`ConfigError` naming every bad key and its allowed values.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

import ml_collections

from verltool_jax.cli.config_loader import ConfigError

_MISSING = object()

# Allowed values per key (algo.* entries are replaced by their registries, see below).
CHOICES: dict[str, tuple[str, ...]] = {
    "stage": ("rl", "sft"),
    "rollout.mode": ("async", "sync"),
    "rollout.obs_truncate_side": ("head", "tail"),
    "algo.adv_estimator": ("grpo", "drgrpo", "rloo"),
    "algo.policy_loss": ("ppo", "gspo"),
    "algo.kl_estimator": ("k1", "k2", "k3"),
    "algo.loss_agg_mode": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                           "seq-mean-token-sum-norm"),
    "optimizer.schedule": ("constant", "cosine", "linear"),
    "sampler.backend": ("vllm", "jax"),
    "sampler.dtype": ("float32", "bfloat16", "float16"),
    "data.format": ("auto", "parquet", "jsonl"),
}

Rule = tuple[Callable[[Any], bool], str]  # (predicate, what the value must be)


def _at_least(bound: int, note: str = "") -> Rule:
    """``value >= bound``, described as ``>= bound`` (with ``note`` in brackets)."""
    return (lambda v: v >= bound), f">= {bound}" + (f" ({note})" if note else "")


def _above(bound: int) -> Rule:
    """``value > bound``, described as ``> bound``."""
    return (lambda v: v > bound), f"> {bound}"


RANGES: dict[str, Rule] = {
    "rollout.max_turns": _at_least(0),
    "rollout.max_response_tokens": _at_least(1),
    "rollout.max_obs_tokens": _at_least(1),
    "rollout.n_samples": _at_least(1),
    "rollout.max_staleness": _at_least(0),
    "rollout.temperature": _at_least(0),
    "rollout.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.top_k": (lambda v: v == -1 or v >= 1, "-1 (off) or >= 1"),
    "rollout.obs_template": (lambda v: v.count("{obs}") == 1, "a string containing {obs} once"),
    "algo.clip_ratio_low": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "algo.clip_ratio_high": _at_least(0),
    "algo.dual_clip_c": _above(1),
    "algo.kl_coef": _at_least(0),
    "algo.entropy_coef": _at_least(0),
    "algo.ppo_epochs": _at_least(1),
    "algo.mini_batch_size": _at_least(1),
    "algo.micro_batch_size": _at_least(1),
    "algo.tis_cap": _at_least(0, "0 disables truncated importance sampling"),
    "optimizer.lr": _above(0),
    "optimizer.warmup_steps": _at_least(0),
    "optimizer.weight_decay": _at_least(0),
    "optimizer.max_grad_norm": _at_least(0, "0 disables clipping"),
    "sampler.num_engines": _at_least(1),
    "sampler.gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "trainer.steps": _at_least(0),
    "trainer.batch_groups": _at_least(1),
    "trainer.log_every": _at_least(1),
    "trainer.ckpt_every": _at_least(0, "0: only at the end"),
    "trainer.keep_ckpts": _at_least(1),
    "trainer.eval_every": _at_least(0, "0: only at the end"),
    "trainer.parity_every": _at_least(0, "0: off"),
    "reward.timeout_s": _above(0),
    "reward.num_workers": _at_least(0, "0: in-process"),
    "mesh_shape": (lambda v: len(v) == 3 and all(isinstance(x, int) and (x >= 1 or x == -1)
                                                 for x in v) and list(v).count(-1) <= 1,
                   "3 ints (data, fsdp, tp), each >= 1 or one -1 meaning 'the rest'"),
}


# Algorithm names come from the algos registries themselves (aliases included).
REGISTRY_CHOICES: dict[str, tuple[str, str]] = {
    "algo.adv_estimator": ("verltool_jax.algos.advantages", "ADVANTAGES"),
    "algo.policy_loss": ("verltool_jax.algos.policy_loss", "POLICY_LOSSES"),
    "algo.kl_estimator": ("verltool_jax.algos.kl", "KL_ESTIMATORS"),
    "algo.loss_agg_mode": ("verltool_jax.algos.aggregation", "AGGREGATIONS"),
}


def choices_for(key: str) -> tuple[str, ...]:
    """Allowed values of ``key``: its algos registry's names, else the fixed table."""
    if key in REGISTRY_CHOICES:
        module, name = REGISTRY_CHOICES[key]
        return tuple(getattr(importlib.import_module(module), name).names())
    return CHOICES[key]


def get_path(config: ml_collections.ConfigDict, key: str, default: Any = _MISSING) -> Any:
    """The value at dotted ``key``, or ``default`` if a part is absent."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return default
        node = node[part]
    return node


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raise :class:`ConfigError` listing every key whose value is not allowed."""
    problems = []
    for key in CHOICES:
        value = get_path(config, key)
        if value is _MISSING:
            continue
        choices = choices_for(key)
        if value not in choices:
            problems.append(f"{key}={value!r} must be one of {list(choices)}")
    for key, (ok, what) in RANGES.items():
        value = get_path(config, key)
        if value is _MISSING or value is None:
            continue
        try:
            good = bool(ok(value))
        except TypeError:
            good = False
        if not good:
            problems.append(f"{key}={value!r} must be {what}")
    n, est = get_path(config, "rollout.n_samples"), get_path(config, "algo.adv_estimator")
    if n is not _MISSING and est in ("grpo", "rloo") and n < 2:
        problems.append(f"rollout.n_samples={n} must be >= 2 for algo.adv_estimator="
                        f"{est!r} (a group of one has advantage 0, so nothing is learned)")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
