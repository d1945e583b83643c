"""The ``algo`` config section: every knob of the advantages, losses and the train step.

:class:`AlgoConfig` is a frozen dataclass validated the :mod:`verltool_jax.schema` way
(field specs for each field's own rule, ``__post_init__`` for the rules between fields);
the registry-backed names (``adv_estimator``, ``policy_loss``, ``kl_estimator``,
``loss_agg_mode``) are checked against their registries once, through the specs'
``choices``. :func:`algo_config` builds it from an ml_collections ``ConfigDict`` / dict
(either the ``algo`` section or a whole experiment config holding one). Its defaults are
the run defaults (``run_config``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from verltool_jax.algos.advantages import ADVANTAGES
from verltool_jax.algos.aggregation import AGGREGATIONS
from verltool_jax.algos.gae import GAE
from verltool_jax.algos.kl import KL_ESTIMATORS
from verltool_jax.algos.offpolicy import IS_LEVELS, MASK_LEVELS, OffPolicyConfig
from verltool_jax.algos.optimizer import OptimConfig
from verltool_jax.algos.policy_loss import POLICY_LOSSES, PolicyLossConfig
from verltool_jax.schema import Checked, above, at_least, in_unit_interval, spec
from verltool_jax.truncation import TOP_K_OFF, TOP_P_OFF, truncation_active

OLD_LOGPROB_SOURCES = ("sampler", "recompute")
_BATCH = at_least(1, "None: the whole batch")
_UNIT = (lambda v: 0 <= v <= 1, "in [0, 1]")
_OPTIONAL_POSITIVE = (lambda v: v is None or v > 0, "> 0 (None: the optimizer section's)")


def adv_estimator_names() -> tuple[str, ...]:
    """Names ``algo.adv_estimator`` accepts: the registered outcome estimators and
    ``gae`` (PPO with a critic, computed in the train step: ``algos.gae``)."""
    return tuple(sorted([*ADVANTAGES.names(), GAE]))


@dataclass(frozen=True)
class AlgoConfig(Checked):
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

    Off-policy corrections (``verltool_jax.algos.offpolicy``, defaults there):
    ``tis_level`` the ratio the truncated IS weight takes (``token``, ``sequence``: the
    product over the sequence, ``geometric``: its geometric mean); ``is_mask`` drops the
    tokens / sequences whose ratio at that level leaves ``[is_mask_low, is_mask_high]``
    (masked IS; ``"token"`` with the band ``[0.5, 5]`` and ``tis_cap >= 5`` is IcePop).
    Both need ``old_logprobs="recompute"`` (against the sampler's own logprobs every
    ratio is 1).
    """

    SECTION: ClassVar[str] = "algo"

    # grpo | drgrpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | gae
    adv_estimator: str = spec("grpo", choices=adv_estimator_names)
    # ppo (= grpo / dapo / vanilla) | gspo | cispo
    policy_loss: str = spec("ppo", choices=POLICY_LOSSES.names)
    # per-turn credit: turn k of K gets gamma^(K-k) of the advantage (1: off; algos.credit)
    turn_discount: float = spec(1.0, check=in_unit_interval())
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28  # DAPO clip-higher (0.2: symmetric PPO clip)
    # None (or 0) disables the dual clip
    dual_clip_c: float | None = spec(
        3.0, check=(lambda v: v == 0 or v > 1, "> 1 (0 or None disables)")
    )
    loss_agg_mode: str = spec("token-mean", choices=AGGREGATIONS.names)
    loss_norm_constant: float | None = None
    # truncated IS weight cap vs sampler; 0/None = off
    tis_cap: float | None = spec(OffPolicyConfig.tis_cap, check=at_least(0, "0 or None disables"))
    # the ratio the truncated IS weight takes: token | sequence | geometric
    tis_level: str = spec(OffPolicyConfig.tis_level, choices=IS_LEVELS)
    # masked IS: off | token | sequence | geometric, band [is_mask_low, is_mask_high]
    is_mask: str = spec(OffPolicyConfig.is_mask, choices=MASK_LEVELS)
    is_mask_low: float = spec(OffPolicyConfig.is_mask_low, check=above(0))
    is_mask_high: float = spec(OffPolicyConfig.is_mask_high, check=above(0))
    kl_coef: float = spec(0.0, check=at_least(0))  # KL loss against the reference policy
    kl_estimator: str = spec("k3", choices=KL_ESTIMATORS.names)
    entropy_coef: float = spec(0.0, check=at_least(0))  # entropy bonus: loss -= coef * entropy
    # sampling temperature (logprobs of logits / T); the run sets rollout.temperature
    temperature: float = spec(1.0, check=above(0), derived=True)
    # the sampler's truncation; the run sets rollout.top_p / rollout.top_k
    top_p: float = spec(TOP_P_OFF, derived=True)
    top_k: int = spec(TOP_K_OFF, derived=True)
    # with top_p < 1 or top_k > 0: the trainer's logprobs renormalised over the sampler's
    # kept set (models.logprobs.truncated_logprobs), as the sampler reports its own
    truncated_logprobs: bool = True
    ppo_epochs: int = spec(1, check=at_least(1))
    mini_batch_size: int | None = spec(64, check=_BATCH)  # trajectories per optimizer update
    micro_batch_size: int | None = spec(16, check=_BATCH)  # trajectories per fwd/bwd pass
    old_logprobs: str = spec("sampler", choices=OLD_LOGPROB_SOURCES)  # before the update
    logprob_chunk_size: int | None = spec(None, check=_BATCH)
    dynamic_sampling: bool = False  # DAPO: drop groups with all-equal rewards
    # batches in a row with no group left before the run stops (0: no limit; verl's
    # algorithm.filter_groups.max_num_gen_batches)
    dynamic_sampling_max_batches: int = spec(0, check=at_least(0, "0: no limit"))
    overlong_buffer_len: int = 0  # DAPO overlong penalty (0 = off)
    overlong_penalty_factor: float = 1.0
    # PPO with a critic (adv_estimator="gae"; algos.gae, models.value): the GAE discount
    # and lambda over the sampled tokens (1, 1: the usual LLM choice; verl's defaults)
    gamma: float = spec(1.0, check=_UNIT)
    lam: float = spec(1.0, check=_UNIT)
    # verl critic.cliprange_value: values move at most this far from the old ones
    value_clip: float | None = spec(0.5, check=at_least(0, "0 or None disables"))
    # the critic's optimizer: the ``optimizer`` section with these three replaced
    # (None: the policy's value; critic_optimizer_config)
    critic_lr: float | None = spec(None, check=_OPTIONAL_POSITIVE)
    critic_warmup_steps: int | None = spec(None, check=(lambda v: v is None or v >= 0, ">= 0"))
    critic_max_grad_norm: float | None = None  # <= 0 disables clipping

    def __post_init__(self) -> None:
        super().__post_init__()
        self.policy_loss_config()  # the loss's own rules on the clip / agg fields together
        if self.uses_critic and self.turn_discount < 1.0:
            raise ValueError(
                f"algo.turn_discount={self.turn_discount} discounts an outcome advantage by "
                "turns; with algo.adv_estimator='gae' the critic's advantages are per token "
                "already (discount them with algo.gamma): set algo.turn_discount=1"
            )
        self.offpolicy_config()  # the band's own rule
        if self.old_logprobs != "recompute" and (
            self.tis_level != OffPolicyConfig.tis_level or self.is_mask != "off"
        ):
            raise ValueError(
                f"algo.tis_level={self.tis_level!r} / algo.is_mask={self.is_mask!r} act only "
                f"with algo.old_logprobs='recompute' (against the sampler's own logprobs "
                f"every ratio is 1); set algo.old_logprobs='recompute' or leave them at "
                f"{OffPolicyConfig.tis_level!r} / 'off'"
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
    def uses_critic(self) -> bool:
        """Whether the run trains a critic (``adv_estimator="gae"``)."""
        return self.adv_estimator == GAE

    def critic_optimizer_config(self, optim: OptimConfig) -> OptimConfig:
        """The critic's optimizer settings: ``optim`` (the run's ``optimizer`` section)
        with ``critic_lr``, ``critic_warmup_steps``, ``critic_max_grad_norm`` where set."""
        changes: dict[str, Any] = {}
        if self.critic_lr is not None:
            changes["lr"] = self.critic_lr
        if self.critic_warmup_steps is not None:
            changes["warmup_steps"] = self.critic_warmup_steps
        if self.critic_max_grad_norm is not None:
            changes["max_grad_norm"] = self.critic_max_grad_norm
        try:
            return dataclasses.replace(optim, **changes)
        except ValueError as e:
            raise ValueError(f"algo.critic_* settings: {e}") from None

    @property
    def reads_behaviour_logprobs(self) -> bool:
        """Whether the train step reads the batch's ``old_logprobs`` / ``sampler_logprobs``:
        not when it recomputes the old logprobs (``old_logprobs="recompute"``) and applies
        no off-policy correction (``tis_cap`` 0/None, ``is_mask="off"``), the uses in
        ``train.step`` (the mismatch metrics are logged only when it does)."""
        return self.old_logprobs != "recompute" or self.offpolicy_config().active

    def offpolicy_config(self) -> OffPolicyConfig:
        return OffPolicyConfig(
            self.tis_cap or None,
            self.tis_level,
            self.is_mask,
            self.is_mask_low,
            self.is_mask_high,
        )

    def truncation(self) -> dict[str, int | float]:
        """The ``top_k`` / ``top_p`` keywords of the trainer's logprobs: the sampler's
        truncation when it truncates and ``truncated_logprobs`` is on, else none."""
        if self.truncated_logprobs and truncation_active(self.top_k, self.top_p):
            return {"top_k": self.top_k, "top_p": self.top_p}
        return {}

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
    return {
        "adv_estimator": adv_estimator_names(),
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
