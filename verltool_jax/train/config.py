"""The ``algo`` config section: every knob of the advantages, losses and the train step.

:class:`AlgoConfig` is a frozen, validated dataclass; :func:`algo_config` builds it from
an ml_collections ``ConfigDict`` / dict (either the ``algo`` section or a whole
experiment config holding one). Its defaults are the run defaults (``run_config``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verltool_jax.algos.advantages import ADVANTAGES
from verltool_jax.algos.kl import KL_ESTIMATORS
from verltool_jax.algos.policy_loss import POLICY_LOSSES, PolicyLossConfig

OLD_LOGPROB_SOURCES = ("sampler", "recompute")


@dataclass(frozen=True)
class AlgoConfig:
    """RL algorithm and train-step settings (config section ``algo``).

    Batch split: a batch of B sequences is cut into B / ``mini_batch_size`` mini-batches
    (one optimizer update each), each into ``mini_batch_size / micro_batch_size``
    micro-batches (gradient accumulation), for ``ppo_epochs`` passes. ``None`` means
    "the whole batch" / "the whole mini-batch".

    Behaviour logprobs: ``old_logprobs="sampler"`` takes the ratio against the logprobs
    the sampler reported for the tokens it drew; ``"recompute"`` against the trainer's own
    logprobs before the update. ``tis_cap`` weighs each token by
    ``min(exp(old - sampler), tis_cap)``, so it only acts with ``"recompute"``: with the
    sampler's logprobs as ``old`` the weight is 1 on every token.
    """

    # grpo | drgrpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline
    adv_estimator: str = "grpo"
    policy_loss: str = "ppo"  # ppo (= grpo / dapo / vanilla) | gspo | cispo
    # per-turn credit: turn k of K gets gamma^(K-k) of the advantage (1: off; algos.credit)
    turn_discount: float = 1.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28  # DAPO clip-higher (0.2: symmetric PPO clip)
    dual_clip_c: float | None = 3.0  # None disables the dual clip
    loss_agg_mode: str = "token-mean"
    loss_norm_constant: float | None = None
    tis_cap: float | None = 2.0  # truncated IS weight cap vs sampler; 0/None = off
    kl_coef: float = 0.0  # KL loss against the reference policy
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0  # entropy bonus: loss -= coef * entropy
    temperature: float = 1.0  # sampling temperature (logprobs of logits / T)
    ppo_epochs: int = 1
    mini_batch_size: int | None = 64  # trajectories per optimizer update
    micro_batch_size: int | None = 16  # trajectories per forward/backward pass
    old_logprobs: str = "sampler"  # sampler | recompute (before the update)
    logprob_chunk_size: int | None = None
    dynamic_sampling: bool = False  # DAPO: drop groups with all-equal rewards
    # batches in a row with no group left before the run stops (0: no limit; verl's
    # algorithm.filter_groups.max_num_gen_batches)
    dynamic_sampling_max_batches: int = 0
    overlong_buffer_len: int = 0  # DAPO overlong penalty (0 = off)
    overlong_penalty_factor: float = 1.0

    def __post_init__(self):
        ADVANTAGES.get(self.adv_estimator)
        POLICY_LOSSES.get(self.policy_loss)
        KL_ESTIMATORS.get(self.kl_estimator)
        self.policy_loss_config()  # validates clip / agg fields
        if self.old_logprobs not in OLD_LOGPROB_SOURCES:
            raise ValueError(
                f"algo.old_logprobs must be one of {OLD_LOGPROB_SOURCES}, got {self.old_logprobs!r}"
            )
        if int(self.dynamic_sampling_max_batches) < 0:
            raise ValueError(
                f"algo.dynamic_sampling_max_batches must be >= 0 (0: no limit), "
                f"got {self.dynamic_sampling_max_batches}"
            )
        for name in ("ppo_epochs",):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("mini_batch_size", "micro_batch_size", "logprob_chunk_size"):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise ValueError(f"algo.{name} must be >= 1 or None, got {v}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError("algo.kl_coef and algo.entropy_coef must be >= 0")
        if not 0.0 < self.turn_discount <= 1.0:
            raise ValueError(
                f"algo.turn_discount must be in (0, 1] (1: every turn gets the whole "
                f"advantage), got {self.turn_discount}"
            )
        if self.temperature <= 0:
            raise ValueError(f"algo.temperature must be > 0, got {self.temperature}")
        if self.tis_cap is not None and self.tis_cap < 0:
            raise ValueError(f"algo.tis_cap must be > 0 (0 or None disables), got {self.tis_cap}")
        if self.dual_clip_c is not None and self.dual_clip_c < 0:
            raise ValueError(
                f"algo.dual_clip_c must be > 1 (0 or None disables), got {self.dual_clip_c}"
            )

    def policy_loss_config(self) -> PolicyLossConfig:
        return PolicyLossConfig(
            self.clip_ratio_low,
            self.clip_ratio_high,
            self.dual_clip_c or None,
            self.loss_agg_mode,
            self.loss_norm_constant,
        )

    @property
    def reads_behaviour_logprobs(self) -> bool:
        """Whether the train step reads the batch's ``old_logprobs`` / ``sampler_logprobs``:
        not when it recomputes the old logprobs (``old_logprobs="recompute"``) and applies
        no truncated IS (``tis_cap`` 0/None), the two uses in ``train.step``."""
        return self.old_logprobs != "recompute" or bool(self.tis_cap)

    def split_sizes(self, batch_size: int) -> tuple[int, int, int]:
        """``(num_mini, num_micro, micro)`` for a batch of ``batch_size``; ValueError if uneven."""
        mini = self.mini_batch_size or batch_size
        micro = self.micro_batch_size or mini
        if batch_size % mini:
            raise ValueError(
                f"batch size {batch_size} is not a multiple of "
                f"algo.mini_batch_size={mini}; pad the batch or change it"
            )
        if mini % micro:
            raise ValueError(
                f"algo.mini_batch_size={mini} is not a multiple of algo.micro_batch_size={micro}"
            )
        return batch_size // mini, mini // micro, micro


FIELDS = tuple(f.name for f in dataclasses.fields(AlgoConfig))


def algo_choices() -> dict[str, tuple[str, ...]]:
    """Allowed names of the registry-backed ``algo`` fields (aliases included)."""
    from verltool_jax.algos.aggregation import AGGREGATIONS

    return {
        "adv_estimator": tuple(ADVANTAGES.names()),
        "policy_loss": tuple(POLICY_LOSSES.names()),
        "kl_estimator": tuple(KL_ESTIMATORS.names()),
        "loss_agg_mode": tuple(AGGREGATIONS.names()),
    }


def algo_config(cfg: Any = None, **overrides) -> AlgoConfig:
    """An :class:`AlgoConfig` from an ``AlgoConfig``, a mapping / ``ConfigDict`` (the
    ``algo`` section, or a config with an ``algo`` field), or None (defaults).

    Unknown keys raise ValueError naming them (typos never pass silently).
    """
    if isinstance(cfg, AlgoConfig):
        return dataclasses.replace(cfg, **overrides) if overrides else cfg
    d: dict = {}
    if cfg is not None:
        if hasattr(cfg, "to_dict"):
            cfg = cfg.to_dict()
        if not isinstance(cfg, Mapping):
            raise ValueError(f"algo config must be a mapping or AlgoConfig, got {type(cfg)}")
        if "algo" in cfg and isinstance(cfg["algo"], Mapping):
            cfg = cfg["algo"]
        d = dict(cfg)
    d.update(overrides)
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown algo config field(s) {unknown}; known: {list(FIELDS)}")
    return AlgoConfig(**d)
