"""optax AdamW with linear warmup, a constant or cosine schedule, and global-norm clipping.

Learning rate at optimizer update s (counted per optimizer update, i.e. per mini-batch):
  warmup (s < W):   lr * (s + 1) / W
  constant:         lr
  cosine:           lr * (m + (1 - m) * (1 + cos(pi * p)) / 2),  p = (s - W) / (S - W) in [0, 1]
  linear:           lr * (1 - (1 - m) * p)
with W = ``warmup_steps``, S = ``total_steps``, m = ``min_lr_ratio``. Gradients are
clipped to global norm ``max_grad_norm`` before AdamW (decoupled weight decay).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import jax.numpy as jnp
import optax

from verltool_jax.schema import Checked, above, at_least, spec

SCHEDULES = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class OptimConfig(Checked):
    """Config section ``optimizer`` (``configs/base.py``); ``total_steps`` is set by the
    run from ``trainer.steps`` (``RunConfig.optimizer_for_run``)."""

    SECTION: ClassVar[str] = "optimizer"

    name: str = spec("adamw", choices=("adamw",))  # only adamw
    lr: float = spec(1e-6, check=above(0))
    warmup_steps: int = spec(0, check=at_least(0))
    total_steps: int = spec(1000, check=at_least(1), derived=True)
    schedule: str = spec("constant", choices=SCHEDULES)
    min_lr_ratio: float = spec(0.0, check=(lambda v: 0.0 <= v <= 1.0, "in [0, 1]"))
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0  # <= 0 disables clipping

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.schedule != "constant" and self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"optimizer.total_steps ({self.total_steps}) must exceed "
                f"optimizer.warmup_steps ({self.warmup_steps}) for a decaying schedule"
            )


def optimizer_config(cfg: Any = None, **overrides) -> OptimConfig:
    """An :class:`OptimConfig` from a mapping / ``ConfigDict`` (the ``optimizer`` section or a
    config holding one); unknown fields raise ValueError naming them."""
    if isinstance(cfg, OptimConfig):
        return dataclasses.replace(cfg, **overrides) if overrides else cfg
    d: dict = {}
    if cfg is not None:
        if hasattr(cfg, "to_dict"):
            cfg = cfg.to_dict()
        for section in ("optimizer", "optim"):
            if section in cfg and isinstance(cfg[section], Mapping):
                cfg = cfg[section]
                break
        d = dict(cfg)
    d.update(overrides)
    known = {f.name for f in dataclasses.fields(OptimConfig)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown optim config field(s) {unknown}; known: {sorted(known)}")
    return OptimConfig(**d)


def lr_schedule(cfg: OptimConfig) -> optax.Schedule:
    """The learning-rate schedule of the module docstring, as an optax schedule."""
    W, S, lr, m = cfg.warmup_steps, cfg.total_steps, cfg.lr, cfg.min_lr_ratio

    def schedule(count):
        s = jnp.asarray(count, jnp.float32)
        warm = lr * (s + 1.0) / max(W, 1)
        if cfg.schedule == "constant":
            after = jnp.asarray(lr, jnp.float32)
        else:
            p = jnp.clip((s - W) / max(S - W, 1), 0.0, 1.0)
            if cfg.schedule == "cosine":
                after = lr * (m + (1.0 - m) * 0.5 * (1.0 + jnp.cos(math.pi * p)))
            else:
                after = lr * (1.0 - (1.0 - m) * p)
        return jnp.where(s < W, warm, after)

    return schedule


def make_optimizer(cfg: Any = None) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) then AdamW(lr_schedule, b1, b2, eps, weight_decay)."""
    cfg = optimizer_config(cfg)
    parts = []
    if cfg.max_grad_norm and cfg.max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(cfg.max_grad_norm))
    parts.append(
        optax.adamw(
            lr_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay
        )
    )
    return optax.chain(*parts)
