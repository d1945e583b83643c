"""Per-turn credit for multi-turn trajectories: the final reward discounted by turns to go.

A multi-turn response alternates model turns (tokens the policy sampled, loss mask 1)
and observations (tool output, loss mask 0). A turn is a maximal run of sampled tokens.
With the outcome reward arriving after the last of K turns, turn k (1-based) is
K - k turns from it; ``algo.turn_discount`` = gamma in (0, 1] weighs the sequence
advantage A_b on the tokens of turn k by

    w_{b,t} = gamma ** (K_b - k(t)),   A_{b,t} = w_{b,t} * A_b

so the last turn gets the full advantage and earlier turns less. For A_b = r_b this is
the discounted return of a terminal reward, G_k = gamma^(K-k) r (Sutton & Barto,
ch. 3), counted in turns rather than tokens (the observation tokens between turns are
not steps of the policy and are skipped). gamma = 1 gives every token A_b: the plain
outcome estimators. verl has no turn-level discount (its ``algorithm.gamma`` counts
response tokens); this is ours.

Positions that are not sampled tokens (the prompt, observations) get the weight of the
turn before them (the prompt: turn 0), so when the observation-mask ablation trains on
observation tokens they carry the credit of the action that produced them; with the
default mask they are masked out by the loss anyway.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def turn_index(loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(turn [B,T] int32, num_turns [B] int32)`` of a [B,T] mask of sampled tokens.

    ``turn[b,t]`` is the 1-based index of the turn that contains position t or is the
    last before it (0 before the first turn); a turn starts where the mask goes 0 -> 1.
    """
    m = loss_mask > 0
    prev = jnp.pad(m[:, :-1], ((0, 0), (1, 0)))
    starts = (m & ~prev).astype(jnp.int32)
    turn = jnp.cumsum(starts, axis=-1)
    return turn, turn[:, -1]


def turn_discount_weights(loss_mask: jax.Array, gamma: float) -> jax.Array:
    """w [B,T] float32 = gamma ** (K_b - turn[b,t]) (module docstring).

    ``loss_mask`` marks the tokens the policy sampled (target-aligned or not: the
    weights follow its positions). Rows without a sampled token get weight 1.
    """
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"algo.turn_discount must be in (0, 1] (1: off), got {gamma}")
    turn, k = turn_index(loss_mask)
    to_go = jnp.maximum(k[:, None] - turn, 0).astype(jnp.float32)
    return jnp.power(jnp.float32(gamma), to_go)


def turn_discounted_advantages(
    advantages: jax.Array, loss_mask: jax.Array, gamma: float
) -> jax.Array:
    """Per-token advantages [B,T] = A_b * gamma ** (K_b - turn[b,t]) (module docstring).

    ``advantages`` [B] (one per sequence); ``loss_mask`` [B,T] the sampled tokens.
    The result is not masked: the loss applies its own mask.
    """
    adv = advantages.astype(jnp.float32)
    if adv.ndim != 1 or adv.shape[0] != loss_mask.shape[0]:
        raise ValueError(
            f"advantages must be [B] with B = loss_mask rows ({loss_mask.shape[0]}), "
            f"got shape {adv.shape}"
        )
    return adv[:, None] * turn_discount_weights(loss_mask, gamma)
