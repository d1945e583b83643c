"""Shared pieces of the train-step and checkpoint tests: a tiny real ``Transformer``,
trajectory batches, and train steps cached per config (one compilation per config for
the whole test session)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import optax
from flax import nnx

from verltool_jax.algos.config import algo_config
from verltool_jax.algos.optimizer import make_optimizer
from verltool_jax.models.config import ModelConfig
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.models.transformer import Transformer
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.train.batch import batch_from_trajectories
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step

VOCAB = 64
MODEL_CFG = ModelConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    intermediate_size=64,
    tie_word_embeddings=True,
)
B, T = 8, 16

# Step configurations used by the tests (few, because each one compiles).
CONFIGS = {
    # GSPO + seq-mean-token-mean + truncated IS weights; the whole batch in one pass
    "gspo_whole": dict(
        policy_loss="gspo",
        loss_agg_mode="seq-mean-token-mean",
        tis_cap=2.0,
        dual_clip_c=None,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        mini_batch_size=None,
        micro_batch_size=None,
    ),
    # the same with 2 micro-batches of 4
    "gspo_micro": dict(
        policy_loss="gspo",
        loss_agg_mode="seq-mean-token-mean",
        tis_cap=2.0,
        dual_clip_c=None,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        mini_batch_size=None,
        micro_batch_size=4,
    ),
    # PPO/DAPO with everything on: recomputed old logprobs, KL vs reference params,
    # entropy bonus, 2 epochs x 2 mini-batches x 2 micro-batches
    "ppo_full": dict(
        policy_loss="ppo",
        clip_ratio_high=0.28,
        dual_clip_c=3.0,
        loss_agg_mode="token-mean",
        old_logprobs="recompute",
        kl_coef=0.1,
        kl_estimator="k3",
        entropy_coef=0.01,
        tis_cap=2.0,
        ppo_epochs=2,
        mini_batch_size=4,
        micro_batch_size=2,
    ),
    # PPO with a critic: GAE advantages, the clipped value loss, 2 mini-batches x 2 micro
    "gae": dict(
        adv_estimator="gae",
        policy_loss="ppo",
        value_clip=0.5,
        mini_batch_size=4,
        micro_batch_size=2,
    ),
}
SGD = optax.sgd(0.5)
ADAMW = make_optimizer(
    dict(
        lr=3e-3,
        warmup_steps=2,
        total_steps=20,
        schedule="cosine",
        min_lr_ratio=0.1,
        weight_decay=0.01,
        max_grad_norm=1.0,
    )
)


def optimizer_for(name: str):
    return ADAMW if name in ("ppo_full", "gae") else SGD


CRITIC_ADAMW = make_optimizer(dict(lr=1e-2, max_grad_norm=1.0))


class CountingLogprobs:
    """``token_logprobs`` that counts how often it is traced (one count per forward graph)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return token_logprobs(*args, **kwargs)


def new_model(seed: int = 0) -> Transformer:
    return Transformer(MODEL_CFG, nnx.Rngs(seed))


def new_state(name: str, seed: int = 0) -> TrainState:
    model = new_model(seed)
    cfg = algo_config(CONFIGS[name])
    state = TrainState.create(model, optimizer_for(name), seed=seed, with_reference=cfg.kl_coef > 0)
    if cfg.uses_critic:
        from verltool_jax.models.value import value_model_from_policy

        state = state.with_critic(value_model_from_policy(model), CRITIC_ADAMW)
    return state


@functools.cache
def step_for(name: str, mesh=None):
    """``(train_step, counter)`` for ``CONFIGS[name]`` (cached: compiled once per session)."""
    counter = CountingLogprobs()
    graphdef = new_state(name).graphdef
    critic = CRITIC_ADAMW if algo_config(CONFIGS[name]).uses_critic else None
    return make_train_step(
        CONFIGS[name],
        graphdef,
        optimizer_for(name),
        mesh=mesh,
        logprob_fn=counter,
        value_optimizer=critic,
    ), counter


def trajectories(seed: int, n: int = B) -> list[Trajectory]:
    """``n`` trajectories in groups of 4 with varied prompt/response lengths, an observation
    span (loss mask 0) and sampler logprobs; lengths fit in T."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(rng.integers(2, 5))
        r = int(rng.integers(3, T - p + 1))
        mask = [1] * r
        if r >= 5:
            mask[2:4] = [0, 0]  # a tool observation
        lp = [float(-rng.uniform(0.5, 5.0)) if m else 0.0 for m in mask]
        out.append(
            Trajectory(
                trajectory_id=f"t{seed}-{i}",
                group_id=f"g{seed}-{i // 4}",
                prompt_ids=rng.integers(1, VOCAB, p).tolist(),
                response_ids=rng.integers(1, VOCAB, r).tolist(),
                loss_mask=mask,
                logprobs=lp,
                versions=[0] * r,
                reward=float(rng.integers(0, 2)),
            )
        )
    return out


def batch(seed: int) -> dict:
    from verltool_jax.algos import compute_advantages

    trajs = trajectories(seed)
    adv = compute_advantages("grpo", [t.reward for t in trajs], [t.group_id for t in trajs])
    if not np.any(adv):
        adv = np.linspace(-1, 1, len(trajs)).astype(np.float32)
    return batch_from_trajectories(trajs, adv, pad_id=0, max_len=T, pad_to_multiple=T)


def gae_batch(seed: int) -> dict:
    """A batch for ``algo.adv_estimator="gae"``: the rewards, zero advantages."""
    trajs = trajectories(seed)
    rewards = np.array([t.reward for t in trajs], np.float32)
    out = batch_from_trajectories(
        trajs, np.zeros_like(rewards), pad_id=0, max_len=T, pad_to_multiple=T
    )
    out["rewards"] = rewards
    return out


def host(tree):
    """A host (numpy) copy of ``tree``, safe from buffer donation."""
    return jax.tree.map(lambda x: np.array(x), tree)
