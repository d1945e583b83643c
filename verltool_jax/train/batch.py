"""The train batch: a dict of right-padded arrays, and its construction from trajectories.

Layout (B sequences, padded length T; row b = prompt tokens then response tokens):

=================== ========= ===========================================================
key                 shape     meaning
=================== ========= ===========================================================
input_ids           [B,T] i32 prompt + response token ids, right-padded with ``pad_id``
attention_mask      [B,T] i32 1 on real tokens, 0 on padding
loss_mask           [B,T] f32 **target-aligned**: ``loss_mask[b,t] = 1`` iff token
                              ``input_ids[b,t+1]`` was sampled by the policy (a response
                              token with ``Trajectory.loss_mask`` 1); last column is 0
advantages          [B]   f32 per-sequence advantage (the loss broadcasts it by the mask)
old_logprobs        [B,T] f32 target-aligned behaviour logprob of ``input_ids[b,t+1]``
                              (filled from the sampler; the step may recompute it)
sampler_logprobs    [B,T] f32 target-aligned logprob the sampler reported
ref_logprobs        [B,T] f32 optional, target-aligned reference-policy logprob
=================== ========= ===========================================================

Target alignment means position t of every per-token array refers to the token the
model predicts *at* position t, i.e. ``targets = input_ids[:, 1:]`` (see
:func:`shift_targets`), which is exactly what ``token_logprobs(model, input_ids,
attention_mask, targets)`` returns at position t.
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

REQUIRED_KEYS = ("input_ids", "attention_mask", "loss_mask", "advantages", "old_logprobs",
                 "sampler_logprobs")
OPTIONAL_KEYS = ("ref_logprobs",)


def shift_targets(input_ids, pad_id: int = 0):
    """``targets[b,t] = input_ids[b,t+1]``; the last column is ``pad_id`` (always masked)."""
    xp = jnp if not isinstance(input_ids, np.ndarray) else np
    pad = xp.full(input_ids.shape[:-1] + (1,), pad_id, dtype=input_ids.dtype)
    return xp.concatenate([input_ids[..., 1:], pad], axis=-1)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def batch_from_trajectories(trajs: Sequence, advantages, pad_id: int, max_len: int,
                            pad_to_multiple: int = 1) -> dict[str, np.ndarray]:
    """Build the train batch (module docstring) from ``Trajectory`` records.

    T is the longest ``len(prompt_ids) + len(response_ids)`` rounded up to
    ``pad_to_multiple`` (so batches reuse few compiled shapes), capped at ``max_len``.
    A trajectory longer than ``max_len`` is an error (it would lose sampled tokens).
    A response of length 0 gives an all-zero loss-mask row (it contributes nothing).
    Returns numpy arrays (place them on the mesh with ``shard_batch``).
    """
    if len(trajs) == 0:
        raise ValueError("batch_from_trajectories needs at least one trajectory")
    adv = np.asarray(advantages, dtype=np.float32)
    if adv.shape != (len(trajs),):
        raise ValueError(f"advantages must have shape ({len(trajs)},) (one per trajectory), "
                         f"got {adv.shape}")
    if pad_to_multiple < 1 or max_len < 2:
        raise ValueError(f"need pad_to_multiple >= 1 and max_len >= 2, got "
                         f"{pad_to_multiple}, {max_len}")
    lengths = []
    for tr in trajs:
        tr.check()
        n = len(tr.prompt_ids) + len(tr.response_ids)
        if len(tr.prompt_ids) == 0:
            raise ValueError(f"trajectory {tr.trajectory_id!r} has an empty prompt_ids")
        if n > max_len:
            raise ValueError(f"trajectory {tr.trajectory_id!r} has {n} tokens > max_len="
                             f"{max_len}; raise max_len or cap the rollout length")
        lengths.append(n)
    T = min(_round_up(max(lengths), pad_to_multiple), max_len)
    B = len(trajs)
    ids = np.full((B, T), pad_id, np.int32)
    attn = np.zeros((B, T), np.int32)
    lmask = np.zeros((B, T), np.float32)
    slp = np.zeros((B, T), np.float32)
    for b, tr in enumerate(trajs):
        p, r = len(tr.prompt_ids), len(tr.response_ids)
        ids[b, :p + r] = np.asarray(list(tr.prompt_ids) + list(tr.response_ids), np.int32)
        attn[b, :p + r] = 1
        # response token j sits at position p + j; it is the target of position p + j - 1
        lmask[b, p - 1:p - 1 + r] = np.asarray(tr.loss_mask, np.float32)
        slp[b, p - 1:p - 1 + r] = np.asarray(tr.logprobs, np.float32) * lmask[b, p - 1:p - 1 + r]
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": lmask, "advantages": adv,
            "old_logprobs": slp.copy(), "sampler_logprobs": slp}


def observation_targets(trajs: Sequence, T: int) -> np.ndarray:
    """[B,T] f32 target-aligned mask of the response tokens the policy did *not* sample
    (tool observations, and tags closed on the model's behalf): ``1`` at position
    ``p - 1 + j`` iff response token j of row b has ``Trajectory.loss_mask`` 0. Rows are
    in ``trajs`` order, positions as in :func:`batch_from_trajectories`."""
    out = np.zeros((len(trajs), T), np.float32)
    for b, tr in enumerate(trajs):
        p, r = len(tr.prompt_ids), len(tr.response_ids)
        n = max(0, min(r, T - p + 1))
        out[b, p - 1:p - 1 + n] = 1.0 - np.asarray(tr.loss_mask[:n], np.float32)
    return out


def include_observations(batch: dict, obs_targets: np.ndarray,
                         behaviour_logprobs: np.ndarray) -> dict:
    """The batch with the observation tokens trained on as if sampled (the ablation of
    the observation mask; by default the framework never does this).

    ``loss_mask = max(loss_mask, obs)``; at the observation positions ``old_logprobs``
    and ``sampler_logprobs`` become ``behaviour_logprobs`` (the trainer's own logprobs
    before the update: no sampler ever scored those tokens, so their ratio starts at 1
    and their truncated IS weight is 1). Other positions are unchanged. Returns a new dict.
    """
    obs = np.asarray(obs_targets, np.float32)
    if obs.shape != batch["loss_mask"].shape:
        raise ValueError(f"obs_targets has shape {obs.shape}, the batch's loss_mask "
                         f"{batch['loss_mask'].shape}")
    lp = np.asarray(behaviour_logprobs, np.float32)
    out = dict(batch)
    out["loss_mask"] = np.maximum(batch["loss_mask"], obs)
    for k in ("old_logprobs", "sampler_logprobs"):
        out[k] = np.where(obs > 0, lp, batch[k]).astype(np.float32)
    return out


def check_batch(batch: dict) -> tuple[int, int]:
    """Validate keys and shapes of a train batch; returns ``(B, T)``. ValueError names the key."""
    missing = [k for k in REQUIRED_KEYS if k not in batch]
    if missing:
        raise ValueError(f"train batch is missing {missing}; build it with "
                         f"batch_from_trajectories (keys: {list(REQUIRED_KEYS)})")
    unknown = sorted(set(batch) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise ValueError(f"train batch has unknown keys {unknown}")
    B, T = batch["input_ids"].shape
    for k in REQUIRED_KEYS + OPTIONAL_KEYS:
        if k not in batch:
            continue
        want = (B,) if k == "advantages" and batch[k].ndim == 1 else (B, T)
        if tuple(batch[k].shape) != want:
            raise ValueError(f"train batch[{k!r}] has shape {tuple(batch[k].shape)}, "
                             f"expected {want}")
    return B, T
