"""The functional, jitted RL train step: ``train_step(state, batch) -> (state, metrics)``.

One call consumes one batch (layout: :mod:`verltool_jax.train.batch`):

1. behaviour logprobs: the batch's ``old_logprobs`` (from the sampler), or, with
   ``algo.old_logprobs = "recompute"``, the current params' logprobs before any update;
2. reference logprobs, only when ``algo.kl_coef > 0``: the batch's ``ref_logprobs`` or
   a forward pass of ``state.ref_params``;
3. for each of ``algo.ppo_epochs`` epochs, for each mini-batch: gradients summed over
   its micro-batches (``lax.scan``), every micro-batch loss normalised by the counts of
   the *whole mini-batch* (so k micro-batches == one batch), then one optimizer update.
   A non-finite loss or gradient norm skips that update (params and optimizer state
   unchanged) and is counted in ``metrics["skipped_updates"]``.

PPO with a critic (``algo.adv_estimator = "gae"``; :mod:`verltool_jax.algos.gae`): the
batch carries each sequence's outcome reward (``rewards`` [B]) instead of advantages;
before the updates the critic (``state.value_params``) scores every position, GAE turns
the rewards and values into token advantages (whitened over the batch) and returns, and
in every mini-batch the policy update is followed by one critic update on the clipped
value loss with the critic's own optimizer (``value_optimizer``).

Loss of a micro-batch = policy loss (``algo.policy_loss``, each token weighed by the
off-policy correction against the sampler, ``algos.offpolicy.offpolicy_weights``, when
``algo.tis_cap`` or ``algo.is_mask`` is set) + ``kl_coef`` * KL(``kl_estimator``)
- ``entropy_coef`` * entropy, each aggregated by ``algo.loss_agg_mode``.

Mini/micro-batch membership is strided: with sizes (n_mini, n_micro, micro), row
``p * n_mini * n_micro + j * n_micro + i`` belongs to micro-batch i of mini-batch j, so
every micro-batch draws rows from every data shard of a batch-sharded array. A
shared-prompt batch (``prefix_ids``, ``train.batch``) is split the same way by whole
prompt groups instead of rows (:func:`split_batch`), and every forward runs each group's
prompt once; with one mini-batch its loss, gradients and update are the plain batch's.

With a ``mesh`` the step is jitted with the batch split over ``(data, fsdp)``, the state
kept in the shardings it arrives in (``verltool_jax.sharding.param_spec`` per parameter), and the
state buffers donated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from verltool_jax.algos.aggregation import aggregate, normaliser_for
from verltool_jax.algos.config import AlgoConfig, algo_config
from verltool_jax.algos.gae import (
    explained_variance,
    gae_advantages_returns,
    masked_whiten,
    outcome_token_rewards,
    value_loss,
)
from verltool_jax.algos.kl import get_kl_fn
from verltool_jax.algos.offpolicy import mismatch_metrics, offpolicy_weights
from verltool_jax.algos.policy_loss import get_policy_loss
from verltool_jax.train.batch import (
    IMAGE_KEYS,
    PREFIX_KEYS,
    RLBatch,
    check_batch,
    row_images_of,
    shift_targets,
)
from verltool_jax.train.parity import PARITY_MASK, first_update, parity_sums
from verltool_jax.train.state import TrainState

LogprobFn = Callable[..., Any]


def _default_logprob_fn() -> LogprobFn:
    from verltool_jax.models.logprobs import token_logprobs

    return token_logprobs


def _split(x: jax.Array, n_mini: int, n_micro: int, micro: int) -> jax.Array:
    """[B, ...] -> [n_mini, n_micro, micro, ...] with the strided membership (docstring)."""
    y = x.reshape((micro, n_mini, n_micro) + x.shape[1:])
    return jnp.moveaxis(y, 0, 2)


def group_size_of(batch: dict) -> int:
    """Rows per prompt group of a shared-prompt batch (``train.batch``), 1 otherwise."""
    if "prefix_ids" not in batch:
        return 1
    return batch["input_ids"].shape[0] // batch["prefix_ids"].shape[0]


def split_batch(batch: dict, n_mini: int, n_micro: int, micro: int) -> dict:
    """Every array of ``batch`` as ``[n_mini, n_micro, micro rows, ...]``. A shared-prompt
    batch is split by whole groups with the strided membership over groups: each row
    array is seen as ``[G, n, ...]``, and micro-batch i of mini-batch j holds groups
    ``p * n_mini * n_micro + j * n_micro + i`` (``micro / n`` of them) and their rows."""
    n = group_size_of(batch)
    if micro % n:
        raise ValueError(
            f"micro-batches of {micro} rows do not hold whole prompt groups of {n}; make "
            "algo.micro_batch_size (and mini_batch_size) a multiple of rollout.n_samples"
        )
    out = {}
    for k, x in batch.items():
        if n == 1 or k in PREFIX_KEYS:
            out[k] = _split(x, n_mini, n_micro, micro // n)
            continue
        y = _split(x.reshape((x.shape[0] // n, n) + x.shape[1:]), n_mini, n_micro, micro // n)
        out[k] = y.reshape((n_mini, n_micro, micro) + x.shape[1:])
    return out


def _reduce_metrics(metrics: dict, axis: int) -> dict:
    """Combine metrics over ``axis``: ``*_max`` by max, ``*_min`` by min, the rest by sum."""
    out = {}
    for k, v in metrics.items():
        if k.endswith("_max"):
            out[k] = v.max(axis)
        elif k.endswith("_min"):
            out[k] = v.min(axis)
        else:
            out[k] = v.sum(axis)
    return out


def _mean_metrics(metrics: dict) -> dict:
    """Over all updates ([epochs, n_mini]): mean, max/min for extremes, sum for counts."""
    out = {}
    for k, v in metrics.items():
        v = v.reshape(-1)
        if k.endswith("_max"):
            out[k] = v.max()
        elif k.endswith("_min"):
            out[k] = jnp.where(jnp.isinf(v.min()), 0.0, v.min())
        elif k.endswith("skipped_updates"):
            out[k] = v.sum()
        else:
            out[k] = v.mean()
    return out


def compute_logprobs(
    graphdef,
    params,
    batch: dict,
    cfg: AlgoConfig,
    logprob_fn: LogprobFn,
    chunk: int,
    return_entropy: bool = False,
):
    """Target-aligned logprobs [B,T] of ``batch`` under ``params`` (and entropy if asked),
    computed ``chunk`` rows at a time (``lax.map``), float32; under the sampler's top-k /
    top-p truncation, renormalised, when it truncates (``AlgoConfig.truncation``). A
    shared-prompt batch goes by whole groups (``chunk`` a multiple of its group size)
    with their prefixes."""
    kw: dict[str, Any] = {"temperature": cfg.temperature, **cfg.truncation()}
    if cfg.logprob_chunk_size:
        kw["chunk_size"] = cfg.logprob_chunk_size
    if return_entropy:
        kw["return_entropy"] = True

    def one(model, i, a, extra):
        return logprob_fn(model, i, a, shift_targets(i), **kw, **extra)

    return _by_rows(one, graphdef, params, batch, chunk)


def _by_rows(fn: Callable, graphdef, params, batch: dict, chunk: int):
    """``fn(model, input_ids, attention_mask, extra)`` over ``batch``, ``chunk`` rows at a
    time (``lax.map``), the results re-joined on the batch axis; ``extra`` holds each
    row's ``positions`` / ``row_images`` in a vision-language batch and each group's
    ``prefix`` in a shared-prompt batch (chunks then hold whole groups)."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    B = ids.shape[0]
    n = group_size_of(batch)
    imgs = {k: batch[k] for k in IMAGE_KEYS if k in batch}
    prefix = {k: batch[k] for k in PREFIX_KEYS if k in batch}

    def one(xs):
        i, a, im, pf = xs
        model = nnx.merge(graphdef, params)
        extra = {}
        if im:  # a vision-language batch: each row's images travel with the row
            extra["positions"], extra["row_images"] = row_images_of(im)
        if pf:  # a shared-prompt batch: each group's prefix travels with its rows
            extra["prefix"] = (pf["prefix_ids"], pf["prefix_mask"])
        return fn(model, i, a, extra)

    if chunk >= B:
        return one((ids, attn, imgs, prefix))
    if chunk % n:
        raise ValueError(f"chunks of {chunk} rows do not hold whole prompt groups of {n}")

    def split(x):
        return x.reshape((B // chunk, chunk) + x.shape[1:])

    def split_groups(x):
        return x.reshape((B // chunk, chunk // n) + x.shape[1:])

    xs = (split(ids), split(attn), jax.tree.map(split, imgs), jax.tree.map(split_groups, prefix))
    out = jax.lax.map(one, xs)
    return jax.tree.map(lambda y: y.reshape((B,) + y.shape[2:]), out)


def compute_values(value_graphdef, value_params, batch: dict, chunk: int) -> jax.Array:
    """The critic's values [B,T] float32 of ``batch`` (target-aligned: position t is the
    state in which token t+1 is drawn), ``chunk`` rows at a time."""
    return _by_rows(
        lambda model, i, a, extra: model(i, a, **extra), value_graphdef, value_params, batch, chunk
    )


def make_value_loss_fn(cfg: AlgoConfig, value_graphdef):
    """``loss_fn(value_params, micro_batch, norm) -> (loss, metrics)``: the clipped value
    loss (``algos.gae.value_loss``) of one micro-batch against its ``returns``."""

    def loss_fn(vparams, mb: dict, norm):
        v = compute_values(value_graphdef, vparams, mb, mb["input_ids"].shape[0])
        return value_loss(
            v,
            mb["values"],
            mb["returns"],
            mb["loss_mask"],
            cfg.value_clip or None,
            cfg.loss_agg_mode,
            norm,
            cfg.loss_norm_constant,
        )

    return loss_fn


def gae_batch(cfg: AlgoConfig, state: TrainState, batch: dict, chunk: int) -> tuple[dict, dict]:
    """The batch with GAE ``advantages`` [B,T] (whitened), the critic's ``values`` and the
    ``returns``, from its ``rewards`` [B] (``algos.gae``); and the critic's metrics before
    the update: ``vf_explained_var``, ``values_mean``, ``returns_mean``."""
    if state.value_params is None:
        raise ValueError(
            "algo.adv_estimator='gae' trains a critic: create the state with "
            "TrainState.with_critic(models.value.value_model_from_policy(policy), optimizer)"
        )
    if "rewards" not in batch:
        raise ValueError(
            "algo.adv_estimator='gae' needs batch['rewards'] (one outcome reward per "
            "sequence); make the batch with train.batch.make_batch"
        )
    mask = batch["loss_mask"]
    values = jax.lax.stop_gradient(
        compute_values(state.value_graphdef, state.value_params, batch, chunk)
    )
    rewards = outcome_token_rewards(batch["rewards"], mask)
    adv, returns = gae_advantages_returns(rewards, values, mask, cfg.gamma, cfg.lam)
    out = dict(batch, advantages=masked_whiten(adv, mask), values=values, returns=returns)
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    metrics = {
        "vf_explained_var": explained_variance(returns, values, mask),
        "values_mean": (values * m).sum() / n,
        "returns_mean": (returns * m).sum() / n,
    }
    return out, metrics


def make_loss_fn(cfg: AlgoConfig, graphdef, logprob_fn: LogprobFn):
    """``loss_fn(params, micro_batch, norm) -> (loss, metrics)`` for one micro-batch."""
    policy_loss = get_policy_loss(cfg.policy_loss)
    pl_cfg = cfg.policy_loss_config()
    op_cfg = cfg.offpolicy_config()
    kl_fn = get_kl_fn(cfg.kl_estimator)
    want_entropy = cfg.entropy_coef > 0

    def loss_fn(params, mb: dict, norm):
        out = compute_logprobs(
            graphdef,
            params,
            mb,
            cfg,
            logprob_fn,
            chunk=mb["input_ids"].shape[0],
            return_entropy=want_entropy,
        )
        logp, ent = out if want_entropy else (out, None)
        mask = mb["loss_mask"].astype(jnp.float32)
        old = mb["old_logprobs"]
        w = offpolicy_weights(old, mb["sampler_logprobs"], mask, op_cfg)
        loss, metrics = policy_loss(logp, old, mb["advantages"], mask, pl_cfg, norm, w)
        if cfg.reads_behaviour_logprobs:  # else the batch's sampler logprobs go unread
            trainer_lp = old if cfg.old_logprobs == "recompute" else jax.lax.stop_gradient(logp)
            metrics.update(mismatch_metrics(trainer_lp, mb["sampler_logprobs"], mask, w, norm))
        if PARITY_MASK in mb:  # the parity metric from this forward (train.parity)
            metrics.update(parity_sums(logp, mb["sampler_logprobs"], mb[PARITY_MASK]))
        agg = lambda x: aggregate(x, mask, cfg.loss_agg_mode, norm, cfg.loss_norm_constant)
        if cfg.kl_coef > 0:
            kl = agg(kl_fn(logp, mb["ref_logprobs"]))
            loss = loss + cfg.kl_coef * kl
            metrics["kl_loss"] = kl
        if want_entropy:
            h = agg(ent)
            loss = loss - cfg.entropy_coef * h
            metrics["entropy"] = h
        metrics["loss"] = loss
        return loss, metrics

    return loss_fn


def _select(ok, new, old):
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def make_train_step(
    config: Any,
    graphdef,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh | None = None,
    logprob_fn: LogprobFn | None = None,
    donate: bool = True,
    value_optimizer: optax.GradientTransformation | None = None,
):
    """Build ``train_step(state: TrainState, batch: dict) -> (TrainState, metrics)``.

    ``config``: an :class:`AlgoConfig`, or a ConfigDict/dict (the ``algo`` section or a
    config holding one). ``logprob_fn`` defaults to ``models.logprobs.token_logprobs``.
    Metrics (float32 scalars, averaged over the updates of the call unless noted):
    ``loss``, ``pg_loss``, ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``,
    ``ratio_mean``, ``ratio_max``, ``ratio_min``, ``grad_norm`` (before clipping),
    ``skipped_updates`` (count), and ``kl_loss``, ``entropy``, ``tis_weight_mean``
    when enabled; the sampler/trainer mismatch (``algos.offpolicy.mismatch_metrics``:
    ``metric_names.TRAIN_MISMATCH_*``) whenever the step reads the sampler's logprobs,
    the trainer's side being the recomputed ``old`` or, without recomputation, the
    logprob of the update (before the first update of the step, the same thing). With a
    critic (``algo.adv_estimator="gae"``, ``value_optimizer`` its optimizer):
    ``vf_loss``, ``vf_clipfrac``, ``vf_grad_norm``, ``vf_skipped_updates`` (count), and
    before the update ``vf_explained_var``, ``values_mean``, ``returns_mean``. With a
    ``parity_mask`` in the batch: ``parity_abs_sum``, ``parity_abs_max``,
    ``parity_tokens`` of the forward before the first update (``train.parity``).
    One compilation per distinct batch shape.
    """
    cfg = algo_config(config)
    logprob_fn = logprob_fn or _default_logprob_fn()
    loss_fn = make_loss_fn(cfg, graphdef, logprob_fn)
    if cfg.uses_critic and value_optimizer is None:
        raise ValueError(
            "algo.adv_estimator='gae' trains a critic: pass make_train_step(..., "
            "value_optimizer=make_optimizer(algo.critic_optimizer_config(optimizer)))"
        )

    def step(state: TrainState, batch: dict):
        # Gradients of the trainable part only (all params, or the LoRA adapters).
        grad_fn = jax.value_and_grad(
            lambda tp, frozen, mb, norm: loss_fn(state.join(tp, frozen), mb, norm), has_aux=True
        )
        B, T = check_batch(batch)
        n_mini, n_micro, micro = cfg.split_sizes(B)
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        batch["advantages"] = batch["advantages"].astype(jnp.float32)
        parity: dict = {}
        if cfg.old_logprobs == "recompute":
            batch["old_logprobs"] = jax.lax.stop_gradient(
                compute_logprobs(graphdef, state.params, batch, cfg, logprob_fn, micro)
            )
            if PARITY_MASK in batch:  # the parity metric from the recomputation
                mask = batch.pop(PARITY_MASK)
                parity = parity_sums(batch["old_logprobs"], batch["sampler_logprobs"], mask)
        elif PARITY_MASK in batch and n_mini > 1:
            raise ValueError(
                f"batch[{PARITY_MASK!r}]: the step scores parity before its first update, "
                f"which sees 1 of its {n_mini} mini-batches; leave the key out (the "
                "trainer does: train.parity.step_can_score) or set algo.mini_batch_size "
                "to the batch size"
            )
        if cfg.kl_coef > 0:
            if "ref_logprobs" not in batch:
                if state.ref_params is None:
                    raise ValueError(
                        "algo.kl_coef > 0 needs batch['ref_logprobs'] or a "
                        "TrainState created with with_reference=True"
                    )
                batch["ref_logprobs"] = jax.lax.stop_gradient(
                    compute_logprobs(graphdef, state.ref_params, batch, cfg, logprob_fn, micro)
                )
        else:
            batch.pop("ref_logprobs", None)
        critic_metrics: dict = {}
        if cfg.uses_critic:
            batch, critic_metrics = gae_batch(cfg, state, batch, micro)
            value_grad_fn = jax.value_and_grad(
                make_value_loss_fn(cfg, state.value_graphdef), has_aux=True
            )
        else:
            batch.pop("rewards", None)
        minis = split_batch(batch, n_mini, n_micro, micro)

        def update_critic(vparams, vopt_state, mini, norm):
            """One critic update on the mini-batch: ``(vparams, vopt_state, metrics)``."""

            def accumulate(g_sum, mb):
                (_, m), g = value_grad_fn(vparams, mb, norm)
                return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_sum, g), m

            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), vparams)
            grads, m = jax.lax.scan(accumulate, zeros, mini)
            m = _reduce_metrics(m, 0)
            gnorm = optax.tree.norm(grads)
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, vparams)
            ok = jnp.isfinite(m["vf_loss"]) & jnp.isfinite(gnorm)
            assert value_optimizer is not None  # checked when the step was made
            updates, new_opt = value_optimizer.update(grads, vopt_state, vparams)
            new_params = optax.apply_updates(vparams, updates)
            m["vf_grad_norm"] = gnorm
            m["vf_skipped_updates"] = (~ok).astype(jnp.float32)
            return _select(ok, new_params, vparams), _select(ok, new_opt, vopt_state), m

        def update(carry, mini):
            params, opt_state, vparams, vopt_state = carry
            norm = normaliser_for(mini["loss_mask"].reshape(-1, T))
            train_p, frozen = state.split_trainable(params)

            def accumulate(g_sum, mb):
                (_, metrics), g = grad_fn(train_p, frozen, mb, norm)
                return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_sum, g), metrics

            # accumulate in float32 (bf16 params would lose small micro-batch gradients)
            zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), train_p)
            grads, metrics = jax.lax.scan(accumulate, zeros, mini)
            metrics = _reduce_metrics(metrics, 0)
            gnorm = optax.tree.norm(grads)
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, train_p)
            ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(gnorm)
            updates, new_opt = optimizer.update(grads, opt_state, train_p)
            new_params = state.join(optax.apply_updates(train_p, updates), frozen)
            metrics["grad_norm"] = gnorm
            metrics["skipped_updates"] = (~ok).astype(jnp.float32)
            if cfg.uses_critic:
                vparams, vopt_state, vm = update_critic(vparams, vopt_state, mini, norm)
                metrics.update(vm)
            params, opt_state = _select(ok, new_params, params), _select(ok, new_opt, opt_state)
            return (params, opt_state, vparams, vopt_state), metrics

        def epoch(carry, _):
            return jax.lax.scan(update, carry, minis)

        carry = (state.params, state.opt_state, state.value_params, state.value_opt_state)
        (params, opt_state, vparams, vopt_state), metrics = jax.lax.scan(
            epoch, carry, None, length=cfg.ppo_epochs
        )
        rng, _ = jax.random.split(state.rng)
        new_state = state.replace(
            params=params,
            opt_state=opt_state,
            value_params=vparams,
            value_opt_state=vopt_state,
            step=state.step + 1,
            rng=rng,
        )
        parity = parity or first_update(metrics)  # before any update: train.parity
        return new_state, _mean_metrics(metrics) | critic_metrics | parity

    donate_args = (0,) if donate else ()
    if mesh is None:
        return jax.jit(step, donate_argnums=donate_args)

    compiled: dict = {}
    replicated = NamedSharding(mesh, P())
    n_shards = mesh.shape["data"] * mesh.shape["fsdp"]

    def leaf_sharding(x):
        s = getattr(x, "sharding", None)
        if isinstance(s, NamedSharding) and s.mesh == mesh:
            return s
        return replicated

    def sharded_step(state: TrainState, batch: dict):
        from verltool_jax.sharding import batch_sharding

        # an array whose batch dimension the (data, fsdp) devices do not divide (a
        # shared-prompt batch's [G, P] prefixes, say) is replicated instead
        split = tuple(sorted(k for k, v in batch.items() if jnp.shape(v)[0] % n_shards == 0))
        key = (jax.tree.structure(state), tuple(sorted(batch)), split)
        if key not in compiled:
            state_sh = jax.tree.map(leaf_sharding, state)
            batch_sh = {
                k: batch_sharding(mesh, jnp.ndim(v)) if k in split else replicated
                for k, v in batch.items()
            }
            compiled[key] = jax.jit(
                step,
                in_shardings=(state_sh, batch_sh),
                out_shardings=(state_sh, replicated),
                donate_argnums=donate_args,
            )
        if jax.process_count() > 1:
            # Several processes: every process holds the whole (same) host batch and
            # places its own rows (jit would not place host arrays across processes).
            batch = {
                k: v
                if isinstance(v, jax.Array)
                else jax.device_put(
                    v, batch_sharding(mesh, jnp.ndim(v)) if k in split else replicated
                )
                for k, v in batch.items()
            }
        with jax.set_mesh(mesh):
            return compiled[key](state, batch)

    return sharded_step


def train_on(train_step: Callable, state: TrainState, batch: RLBatch) -> tuple[TrainState, dict]:
    """One step of ``train_step`` (from :func:`make_train_step`) on ``batch.arrays``: the
    new state, and the step's metrics as floats under ``train/`` beside the batch's own
    (``batch.metrics``). Waits for the step (its metrics are read back)."""
    state, m = train_step(state, batch.arrays)
    metrics = dict(batch.metrics)
    metrics.update({f"train/{k}": float(v) for k, v in jax.device_get(m).items()})
    return state, metrics
