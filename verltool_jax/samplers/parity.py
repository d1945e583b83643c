"""Sampler-vs-trainer logprob parity, measured after every weight sync.

For a few sampled completions, the trainer recomputes
``log_softmax(model(prompt + completion) / T)[sampled token]`` for each sampled token
and compares with the sampler's logprobs; the mean and max absolute difference are the
metric (a drift here means the sampler runs other weights or other numerics than the
trainer, and the importance ratios are off).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Completion


def trainer_logprobs(
    model: Any,
    samples: Sequence[tuple[Sequence[int], Completion]],
    temperature: float,
    pad_id: int = 0,
) -> list[np.ndarray]:
    """The trainer's logprob of each sampled token, one array per sample.

    Builds one right-padded batch of ``prompt + completion`` and calls
    ``models.logprobs.token_logprobs`` with ``targets[t] = input_ids[t+1]``; sample ``i``'s
    values are positions ``len(prompt)-1 ... len(prompt)+len(completion)-2``.
    Greedy samples (T == 0) are scored at T = 1, as the samplers report them.
    """
    import jax.numpy as jnp

    from verltool_jax.models.logprobs import token_logprobs

    if not samples:
        raise ValueError("parity needs at least one (prompt, completion) sample")
    seqs = [list(p) + list(c.token_ids) for p, c in samples]
    T = max(len(s) for s in seqs)
    ids = np.full((len(seqs), T), pad_id, np.int32)
    mask = np.zeros((len(seqs), T), np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    targets = np.concatenate([ids[:, 1:], np.full((len(seqs), 1), pad_id, np.int32)], axis=1)
    lp = np.asarray(
        token_logprobs(
            model,
            jnp.asarray(ids),
            jnp.asarray(mask),
            jnp.asarray(targets),
            temperature=temperature or 1.0,
        )
    )
    out = []
    for i, (p, c) in enumerate(samples):
        start = len(p) - 1
        out.append(lp[i, start : start + len(c.token_ids)])
    return out


def logprob_parity(
    model: Any, samples: Sequence[tuple[Sequence[int], Completion]], temperature: float
) -> dict:
    """``{"mean_abs_diff", "max_abs_diff", "num_tokens"}`` of |trainer - sampler| logprobs."""
    ref = trainer_logprobs(model, samples, temperature)
    diffs = np.concatenate(
        [np.abs(r - np.asarray(c.logprobs, np.float32)) for r, (_, c) in zip(ref, samples)]
    )
    if diffs.size == 0:
        raise ValueError("parity samples hold no sampled tokens")
    return {
        "mean_abs_diff": float(diffs.mean()),
        "max_abs_diff": float(diffs.max()),
        "num_tokens": int(diffs.size),
    }
