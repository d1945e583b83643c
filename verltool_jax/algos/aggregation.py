"""Loss aggregation: a per-token loss matrix [B,T] and its mask -> one scalar.

Follows verl ``core_algos.agg_loss``. With m[b,t] the loss mask, n_b = sum_t m[b,t]
the valid tokens of row b, N_tok = sum_b n_b and N_seq = #{b : n_b > 0}:

* ``token-mean``:              sum_{b,t} m*l / N_tok
* ``seq-mean-token-mean``:     sum_b (sum_t m*l / n_b) / N_seq
* ``seq-mean-token-sum``:      sum_b (sum_t m*l) / N_seq
* ``seq-mean-token-sum-norm``: sum_b (sum_t m*l) / C, C a constant (config
                               ``algo.loss_norm_constant``; default T, the padded
                               response length, as verl's ``loss_mask.shape[-1]``):
                               Dr.GRPO's normalisation, no division by the number of
                               sequences.

Deliberate difference from verl: the seq-mean modes divide by N_seq, the rows with at
least one valid token, where verl takes ``torch.mean`` over all B rows; a fully masked
row (batch padding) would make verl's ``seq-mean-token-mean`` NaN (0/0) and would
dilute the others. On batches without such rows the two agree. Empty denominators
are taken as 1 (an all-masked batch gives loss 0, never NaN).

Gradient accumulation: the mini-batch is split into micro-batches, and each
micro-batch's aggregate must use the counts of the *whole mini-batch*
(:class:`Normaliser`), so that the micro-batch losses (and their gradients) sum to
exactly the mini-batch loss, rather than averaging micro-batch means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from verltool_jax.algos.registry import Registry

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


class Normaliser(NamedTuple):
    """Denominators of the aggregation: valid tokens and non-empty sequences (float32)."""

    num_tokens: jax.Array
    num_seqs: jax.Array


def normaliser_for(mask: jax.Array) -> Normaliser:
    """The counts (N_tok, N_seq) of ``mask`` [B,T] (use the whole mini-batch's mask)."""
    m = mask.astype(jnp.float32)
    per_row = m.sum(-1)
    return Normaliser(num_tokens=per_row.sum(), num_seqs=(per_row > 0).sum().astype(jnp.float32))


AggFn = Callable[[jax.Array, jax.Array, Normaliser, float], jax.Array]
AGGREGATIONS: Registry[AggFn] = Registry("loss aggregation mode", "algo.loss_agg_mode")


def _safe(x: jax.Array) -> jax.Array:
    return jnp.maximum(x, 1.0)


@AGGREGATIONS.register("token-mean")
def _token_mean(loss, m, norm, c):
    return (loss * m).sum() / _safe(norm.num_tokens)


@AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss, m, norm, c):
    per_seq = (loss * m).sum(-1) / _safe(m.sum(-1))
    return per_seq.sum() / _safe(norm.num_seqs)


@AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss, m, norm, c):
    return (loss * m).sum() / _safe(norm.num_seqs)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss, m, norm, c):
    return (loss * m).sum() / c


def check_agg_mode(mode: str) -> str:
    """Validate ``mode`` (ValueError listing the choices); returns it."""
    AGGREGATIONS.get(mode)
    return mode


def aggregate(
    loss_mat: jax.Array,
    mask: jax.Array,
    mode: str,
    norm: Normaliser | None = None,
    norm_constant: float | None = None,
) -> jax.Array:
    """Aggregate ``loss_mat`` [B,T] over ``mask`` [B,T] by ``mode`` (see module docstring).

    ``norm``: counts of the enclosing mini-batch (default: of ``mask`` itself).
    ``norm_constant``: C of ``seq-mean-token-sum-norm`` (default: T).
    Invalid positions are zeroed with ``where`` so NaN/inf there cannot leak.
    """
    fn = AGGREGATIONS.get(mode)
    m = mask.astype(jnp.float32)
    loss = jnp.where(m > 0, loss_mat.astype(jnp.float32), 0.0)
    if norm is None:
        norm = normaliser_for(m)
    c = float(norm_constant) if norm_constant else float(loss_mat.shape[-1])
    return fn(loss, m, norm, c)


def token_mean(x: jax.Array, mask: jax.Array, norm: Normaliser | None = None) -> jax.Array:
    """Masked token mean sum(m*x)/N_tok (used for metrics; additive over micro-batches)."""
    return aggregate(x, mask, "token-mean", norm)
