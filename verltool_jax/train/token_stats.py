"""The token pass: what the trainer thinks of every sampled token, recorded on the
trajectory (``Trajectory.token_stats``) so that the trajectory dumps and the HTML report
(``reporting/token_view.py``) show where the sampler and the trainer disagree.

One forward pass of the params that are about to be updated (those of the trained
version, before the step) over rows of the batch (``train.metrics.parity_batch``): those
the parity metric scores anyway (the trajectories with tokens of the trained version),
the first ``logging.report_trajectories`` (the ones the HTML report shows) or, with
``logging.dump_trajectories``, all (:func:`recorded_rows`). It scores as the train step's
recompute of ``old`` does: at the sampling temperature ``T``, under
the sampler's top-k / top-p truncation renormalised when ``AlgoConfig.truncation`` says
so, in float32. For response token ``y_j`` after prefix ``x_{<j}``, with
``p = softmax(z / T)`` over the (kept) vocabulary:

* ``trainer_logprob_j = log p(y_j | x_{<j})`` (``models.logprobs.token_logprobs``);
* ``entropy_j = -sum_v p(v) log p(v)``, the same distribution's entropy;
* ``is_weight_j``: the weight ``algos.offpolicy.offpolicy_weights`` gives the token
  (``min(r, tis_cap) * keep``, 0 where masked) with ``old = trainer_logprob``: recorded
  only with ``algo.old_logprobs="recompute"`` and an active correction (otherwise the
  step's weight is 1 on every token). The step recomputes ``old`` jitted, in
  micro-batches: the weight here is the step's up to float rounding (a token right at a
  band's edge can fall on the other side).

Observation tokens get None. The parity metric (``sync/logprob_diff_*``, untruncated)
comes from the same logprobs when the trainer does not truncate; with truncation it is
measured by its own untruncated pass (``train.metrics.sampler_parity``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from verltool_jax.algos.config import AlgoConfig
from verltool_jax.rollout.trajectory import ENTROPY, IS_WEIGHT, TRAINER_LOGPROB, Trajectory
from verltool_jax.samplers.parity import parity_of
from verltool_jax.train.batch import shift_targets
from verltool_jax.train.metrics import (
    parity_batch,
    parity_metrics,
    parity_picks,
    response_start,
    sampler_parity,
)


def recorded_rows(logging: Any) -> int | None:
    """How many leading trajectories of a batch the token pass records besides those the
    parity metric scores anyway: every one (None) when ``logging`` is None or its
    ``dump_trajectories`` writes them all, else the ``report_trajectories`` the report
    shows."""
    if logging is None or logging.dump_trajectories:
        return None
    return int(logging.report_trajectories)


def pass_due(rc: Any, version: int, parity_due: bool) -> bool:
    """Whether the RL step that trains ``version`` runs the token pass (``rc``: the run
    config): the parity metric needs it (``parity_due``: due and not scored by the train
    step, ``train.parity``), or what it records is shown: the HTML report shows the last
    batch (the last step), the trajectory dumps every parity step's batch
    (``logging.dump_trajectories``)."""
    from verltool_jax.train.parity import due

    dumped = bool(rc.logging.dump_trajectories) and due(rc.trainer, version)
    return parity_due or dumped or version + 1 >= rc.trainer.steps


def token_pass(
    model: Any,
    trajs: Sequence[Trajectory],
    version: int,
    algo: AlgoConfig,
    pad_id: int,
    max_len: int,
    shared_prompt: str = "auto",
    logging: Any = None,
    parity: bool = True,
) -> dict:
    """Record ``token_stats`` (module docstring) on the first :func:`recorded_rows` of
    ``trajs`` (``logging``: the run's logging section; None: all) and, with ``parity``, on
    the trajectories that sampled tokens with ``version``, scored in one pass; return the
    parity metrics of the tokens ``version`` sampled (``{}`` when none or without
    ``parity``: the train step gave them), as ``train.metrics.sampler_parity`` does."""
    import jax.numpy as jnp

    from verltool_jax.models.logprobs import token_logprobs

    first = recorded_rows(logging)
    trajs = [
        t
        for i, t in enumerate(trajs)
        if first is None or i < first or (parity and any(v == version for v in t.versions))
    ]
    if not any(t.response_ids for t in trajs):
        return {}
    b, kw, n = parity_batch(trajs, pad_id, max_len, shared_prompt)
    trunc: dict[str, Any] = dict(algo.truncation())
    ids = b["input_ids"]
    lp, ent = token_logprobs(
        model,
        jnp.asarray(ids),
        jnp.asarray(b["attention_mask"]),
        jnp.asarray(shift_targets(ids)),
        temperature=algo.temperature,
        return_entropy=True,
        **trunc,
        **kw,
    )
    lp, ent = np.asarray(lp), np.asarray(ent)
    starts = [response_start(t, n) for t in trajs]
    rows_lp = [lp[i, s : s + len(t.response_ids)] for i, (t, s) in enumerate(zip(trajs, starts))]
    rows_ent = [ent[i, s : s + len(t.response_ids)] for i, (t, s) in enumerate(zip(trajs, starts))]
    weights = None
    if algo.old_logprobs == "recompute" and algo.offpolicy_config().active:
        weights = token_weights(rows_lp, trajs, algo)
    for i, t in enumerate(trajs):
        stats = {TRAINER_LOGPROB: rows_lp[i], ENTROPY: rows_ent[i]}
        if weights is not None:
            stats[IS_WEIGHT] = weights[i]
        t.token_stats = {k: _on_sampled(v, t.loss_mask) for k, v in stats.items()}
    if not parity:
        return {}
    if trunc:  # parity compares untruncated logprobs
        return sampler_parity(
            model, trajs, version, algo.temperature, pad_id, max_len, shared_prompt
        )
    return parity_metrics(parity_of(lp, parity_picks(trajs, version, n)))


def token_weights(
    trainer_logprobs: Sequence[np.ndarray], trajs: Sequence[Trajectory], algo: AlgoConfig
) -> list[np.ndarray]:
    """Each trajectory's off-policy weight per response token:
    ``algos.offpolicy.offpolicy_weights(old, sampler, loss_mask, algo.offpolicy_config())``
    with ``old`` its row of ``trainer_logprobs`` and ``sampler`` its ``logprobs``, on
    response-aligned rows padded with mask 0 (a sequence's ratio sums only its own
    sampled tokens, as in the train batch)."""
    import jax.numpy as jnp

    from verltool_jax.algos.offpolicy import offpolicy_weights

    width = max(len(t.response_ids) for t in trajs)
    old, sampler, mask = (np.zeros((len(trajs), width), np.float32) for _ in range(3))
    for i, (t, row) in enumerate(zip(trajs, trainer_logprobs)):
        k = len(t.response_ids)
        old[i, :k], sampler[i, :k], mask[i, :k] = row, t.logprobs, t.loss_mask
    w = offpolicy_weights(
        jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(mask), algo.offpolicy_config()
    )
    if w is None:
        raise ValueError(
            "token_weights: the algo section applies no off-policy correction (algo.tis_cap "
            "0/None and algo.is_mask='off'): every weight is 1; set one of them"
        )
    weights = np.asarray(w)
    return [weights[i, : len(t.response_ids)] for i, t in enumerate(trajs)]


def _on_sampled(values: np.ndarray, loss_mask: Sequence[int]) -> list[float | None]:
    """``values`` as JSON numbers to float32 precision (7 significant digits), None where
    the token is an observation (``loss_mask`` 0)."""
    return [float(f"{v:.7g}") if m else None for v, m in zip(values.tolist(), loss_mask)]
