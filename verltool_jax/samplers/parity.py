"""Sampler-vs-trainer logprob parity: one implementation, two callers.

For tokens a sampler sampled, the trainer recomputes
``log_softmax(model(sequence) / T)[sampled token]`` and compares with the logprob the
sampler reported; the mean and max absolute difference are the metric (a drift here means
the sampler runs other weights or other numerics than the trainer, and the importance
ratios are off). :func:`token_parity` is the arithmetic; :func:`logprob_parity` applies it
to ``(prompt, Completion)`` samples (the sampler tests), and the trainer's per-step
``sync/logprob_diff_*`` metric (``train.metrics.sampler_parity``) to trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Completion


def token_parity(
    model: Any,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    picks: Sequence[tuple[int, int, float]],
    temperature: float,
    **model_inputs: Any,
) -> dict:
    """``{"mean_abs_diff", "max_abs_diff", "num_tokens"}`` of |trainer - sampler| over
    ``picks``, or ``{}`` when there is none.

    ``picks`` are ``(row, t, sampler_logprob)``: the token ``input_ids[row, t + 1]``,
    scored by ``models.logprobs.token_logprobs(model, input_ids, attention_mask,
    input_ids[:, 1:])`` at position ``t`` (target-aligned). ``model_inputs`` go to the
    model (M-RoPE positions and images of a vision-language batch)."""
    import jax.numpy as jnp

    from verltool_jax.models.logprobs import token_logprobs

    if not picks:
        return {}
    ids = np.asarray(input_ids)
    targets = np.concatenate([ids[:, 1:], np.zeros((ids.shape[0], 1), ids.dtype)], axis=1)
    lp = np.asarray(
        token_logprobs(
            model,
            jnp.asarray(ids),
            jnp.asarray(attention_mask),
            jnp.asarray(targets),
            temperature=temperature,
            **model_inputs,
        )
    )
    return parity_of(lp, picks)


def parity_of(trainer_logprobs: np.ndarray, picks: Sequence[tuple[int, int, float]]) -> dict:
    """``{"mean_abs_diff", "max_abs_diff", "num_tokens"}`` of
    ``|trainer_logprobs[row, t] - sampler_logprob|`` over ``picks`` (``(row, t,
    sampler_logprob)``, as :func:`token_parity` takes them), or ``{}`` when there is none."""
    if not picks:
        return {}
    lp = trainer_logprobs
    d = np.array([abs(float(lp[r, t]) - s) for r, t, s in picks], np.float64)
    return {"mean_abs_diff": float(d.mean()), "max_abs_diff": float(d.max()), "num_tokens": d.size}


def logprob_parity(
    model: Any,
    samples: Sequence[tuple[Sequence[int], Completion]],
    temperature: float,
    pad_id: int = 0,
) -> dict:
    """:func:`token_parity` of every sampled token of ``(prompt, completion)`` samples,
    one right-padded row ``prompt + completion`` each. Greedy samples (T == 0) are
    scored at T = 1, as the samplers report them."""
    if not samples:
        raise ValueError("parity needs at least one (prompt, completion) sample")
    seqs = [list(p) + list(c.token_ids) for p, c in samples]
    ids = np.full((len(seqs), max(len(s) for s in seqs)), pad_id, np.int32)
    mask = np.zeros(ids.shape, np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    picks = [
        (i, len(p) - 1 + j, float(lp))
        for i, (p, c) in enumerate(samples)
        for j, lp in enumerate(c.logprobs)
    ]
    if not picks:
        raise ValueError("parity samples hold no sampled tokens")
    return token_parity(model, ids, mask, picks, temperature or 1.0)
