"""Sampler-vs-trainer logprob parity at no extra cost: from the train step's own forward.

The parity metric (``sync/logprob_diff_mean``, ``sync/logprob_diff_max``,
``sync/parity_tokens``; ``docs/samplers.md``) compares, for every token that the current
policy version sampled, the sampler's reported logprob with the trainer's logprob of
the same token under the same parameters. The separate pass
(``train.metrics.sampler_parity``) runs one more forward over the batch for it (15-22 s
of a SmolLM2 step on 2 cores, run eagerly). The train step already runs that forward:

* with ``algo.old_logprobs="recompute"`` its recomputation *is* the trainer's logprobs
  under the parameters that sampled;
* otherwise, when the step makes exactly one pass over its batch before its first
  update (one mini-batch: ``algo.mini_batch_size`` holds the batch), the first update's
  forward is computed under those parameters too (``ppo_epochs > 1`` repeats it after
  the update; only the first epoch counts here).

So the batch carries ``parity_mask`` [B,T] (target-aligned, 1 where the token was
sampled by the version about to be trained: a loss-mask token whose
``Trajectory.versions`` entry is that version) and the step returns, from that forward,
``sum |trainer - sampler|``, ``max |trainer - sampler|`` and the token count over the
mask (:func:`parity_sums`); :func:`from_step` turns them into the metric.

Where this differs from the separate pass: it scores the batch's rows (trajectories that
failed or that dynamic sampling dropped are not in it), and the trainer's logprobs are
the loss's own (renormalised under the sampler's top-k / top-p truncation when it
truncates, ``AlgoConfig.truncation``; the separate pass never renormalises). Without
truncation the two agree to float32 rounding (``tests/train/test_free_parity.py``).
``trainer.parity_source="pass"`` keeps the separate pass; it also runs whenever the step
cannot provide the figure (several mini-batches without recomputation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from verltool_jax import metric_names as names

PARITY_MASK = "parity_mask"  # the optional batch key (train.batch.OPTIONAL_KEYS)
_STEP_KEYS = (names.TRAIN_PARITY_ABS_SUM, names.TRAIN_PARITY_ABS_MAX, names.TRAIN_PARITY_TOKENS)


def parity_sums(
    trainer_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array
) -> dict[str, jax.Array]:
    """``{parity_abs_sum: sum_m |d|, parity_abs_max: max_m |d|, parity_tokens: sum m}``
    with ``d = trainer_logp - sampler_logp`` over the positions where ``mask`` is 1
    (float32 scalars; the max is 0 with no token). Sums and maxima, so micro-batch values
    combine into the batch's (``train.step._reduce_metrics``: ``*_max`` by max, the rest
    by sum). The trainer side is taken without gradient. The metric of
    ``samplers.parity.token_parity``: mean = sum / tokens."""
    m = mask.astype(jnp.float32)
    d = jnp.abs(jax.lax.stop_gradient(trainer_logp).astype(jnp.float32) - sampler_logp) * m
    return {
        names.TRAIN_PARITY_ABS_SUM: d.sum(),
        names.TRAIN_PARITY_ABS_MAX: jnp.max(jnp.where(m > 0, d, 0.0)),
        names.TRAIN_PARITY_TOKENS: m.sum(),
    }


def first_update(metrics: dict) -> dict:
    """Pop the parity sums out of the step's per-update metrics (leading axes
    ``[epochs, n_mini]``) and return those of the first update: the forward before any
    parameter change."""
    return {k: metrics.pop(k).reshape(-1)[0] for k in _STEP_KEYS if k in metrics}


def step_can_score(algo: Any, batch_size: int) -> bool:
    """Whether the train step's own forward scores the whole batch under the parameters
    that sampled it: the old logprobs are recomputed, or one mini-batch holds the batch."""
    return algo.old_logprobs == "recompute" or algo.split_sizes(batch_size)[0] == 1


def parity_mask(rows: Sequence[Any], shape: tuple[int, int], version: int, shared: bool):
    """[B,T] float32 target-aligned mask of the tokens of ``rows`` (the batch's first
    ``len(rows)`` rows, in order) that ``version`` sampled, at the positions
    ``train.batch.batch_from_trajectories`` puts them: response token j at ``p - 1 + j``
    with ``p`` the prompt length (1 in the shared-prompt layout, whose row starts with
    the last prompt token). Padding rows after them stay 0."""
    out = np.zeros(shape, np.float32)
    for b, tr in enumerate(rows):
        start = (1 if shared else len(tr.prompt_ids)) - 1
        for j, (m, v) in enumerate(zip(tr.loss_mask, tr.versions)):
            if m and v == version:
                out[b, start + j] = 1.0
    return out


def due(trainer: Any, version: int) -> bool:
    """Whether this step logs parity: every ``trainer.parity_every`` steps (0: never)."""
    return bool(trainer.parity_every) and version % trainer.parity_every == 0


def score_in_step(trainer: Any, algo: Any, batch: Any, version: int) -> bool:
    """Add ``parity_mask`` to ``batch.arrays`` (a ``train.batch.RLBatch``) when the step
    can score it (:func:`step_can_score`) and ``trainer.parity_source`` is ``auto``;
    True when added (the separate pass is then not needed)."""
    arrays = batch.arrays
    if trainer.parity_source != "auto" or not step_can_score(algo, len(arrays["input_ids"])):
        return False
    shape = arrays["loss_mask"].shape
    arrays[PARITY_MASK] = parity_mask(batch.trajectories, shape, version, "prefix_ids" in arrays)
    return True


def from_step(metrics: dict) -> dict:
    """Replace the train step's parity sums (``train/parity_*`` in ``metrics``, as
    ``train.step.train_on`` logs them) by the parity metric: ``sync/logprob_diff_mean``
    (sum / tokens), ``sync/logprob_diff_max``, ``sync/parity_tokens``; none when no
    token was scored (as the separate pass). Returns ``metrics``, changed in place."""
    got = {k: metrics.pop(f"train/{k}") for k in _STEP_KEYS if f"train/{k}" in metrics}
    if got.get(names.TRAIN_PARITY_TOKENS, 0) > 0:
        n = got[names.TRAIN_PARITY_TOKENS]
        metrics[names.PARITY_DIFF_MEAN] = got[names.TRAIN_PARITY_ABS_SUM] / n
        metrics[names.PARITY_DIFF_MAX] = got[names.TRAIN_PARITY_ABS_MAX]
        metrics[names.PARITY_TOKENS] = int(n)
    return metrics
