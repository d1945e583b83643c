"""Supervised fine-tuning on demonstrations (the warm start before RL).

Loss of a batch (target-aligned ``loss_mask``, see :mod:`verltool_jax.train.batch`):

    L = - sum_{b,t} mask[b,t] * log p(input_ids[b,t+1] | input_ids[b,:t+1]) / sum mask

i.e. the token-mean negative log-likelihood of the response tokens the demonstration
marks as trained (model turns and EOS); observation tokens have mask 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from verltool_jax.data.sft import SFTExample
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.train.batch import (
    IMAGE_KEYS,
    batch_from_trajectories,
    row_images_of,
    shift_targets,
)
from verltool_jax.train.state import TrainState

log = logging.getLogger(__name__)

SFT_KEYS = ("input_ids", "attention_mask", "loss_mask")


def sft_batch(
    examples: Sequence[SFTExample], pad_id: int, max_len: int, pad_to_multiple: int = 16
) -> dict:
    """Right-padded ``input_ids``/``attention_mask``/target-aligned ``loss_mask`` arrays.

    Built with the same code as the RL batch, so SFT and RL align tokens identically.
    """
    trajs = [
        Trajectory(
            trajectory_id=f"sft-{e.index}",
            group_id=f"sft-{e.index}",
            prompt_ids=list(e.prompt_ids),
            response_ids=list(e.response_ids),
            loss_mask=list(e.loss_mask),
            logprobs=[0.0] * len(e.response_ids),
            versions=[0] * len(e.response_ids),
        )
        for e in examples
    ]
    full = batch_from_trajectories(trajs, [0.0] * len(trajs), pad_id, max_len, pad_to_multiple)
    return {k: full[k] for k in SFT_KEYS}


def sft_trajectory_batch(
    trajs: Sequence[Trajectory], pad_id: int, max_len: int, pad_to_multiple: int = 16
) -> dict:
    """The SFT batch of recorded trajectories (e.g. a teacher's rollouts): their loss mask
    as recorded, and their images when they have any (``train.batch.IMAGE_KEYS``)."""
    full = batch_from_trajectories(trajs, [0.0] * len(trajs), pad_id, max_len, pad_to_multiple)
    return {k: v for k, v in full.items() if k in SFT_KEYS or k in IMAGE_KEYS}


def sft_loss(model: nnx.Module, batch: dict) -> tuple[jax.Array, dict]:
    """Token-mean NLL over ``loss_mask`` (module docstring) and its metrics; a batch with
    image keys feeds each row's images to a vision-language model."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    positions, row_images = row_images_of(batch)
    extra = {} if row_images is None else {"positions": positions, "row_images": row_images}
    logp = token_logprobs(model, ids, attn, shift_targets(ids), **extra)
    mask = batch["loss_mask"].astype(jnp.float32)
    n = jnp.maximum(mask.sum(), 1.0)
    loss = -(logp * mask).sum() / n
    # Teacher-forced token accuracy is not available from logprobs alone; report the
    # mean per-token probability of the demonstrated tokens instead.
    return loss, {
        "sft_loss": loss,
        "sft_token_prob": (jnp.exp(logp) * mask).sum() / n,
        "sft_tokens": mask.sum(),
    }


def make_sft_step(graphdef, optimizer: optax.GradientTransformation):
    """``step(state, batch) -> (state, metrics)``: one jitted SFT update (NaN-safe)."""

    def step(state: TrainState, batch: dict):
        train_p, frozen = state.split_trainable()  # all params, or the LoRA adapters

        def loss_fn(tp, batch):
            return sft_loss(nnx.merge(graphdef, state.join(tp, frozen)), batch)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(train_p, batch)
        gnorm = optax.tree.norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        updates, new_opt = optimizer.update(grads, state.opt_state, train_p)
        new_params = state.join(optax.apply_updates(train_p, updates), frozen)
        keep = lambda n, o: jax.tree.map(lambda a, b: jnp.where(ok, a, b), n, o)
        metrics = dict(metrics, grad_norm=gnorm, skipped_updates=(~ok).astype(jnp.float32))
        return state.replace(
            params=keep(new_params, state.params),
            opt_state=keep(new_opt, state.opt_state),
            step=state.step + 1,
        ), metrics

    return jax.jit(step, donate_argnums=(0,))


def run_sft(run, should_stop: Callable[[], bool] | None = None) -> nnx.Module:
    """The supervised warm start of a run (``sft`` section) on ``run.files["sft"]``:
    AdamW with linear warmup to ``sft.lr``, constant after, gradients clipped to norm 1;
    progress every tenth of the steps. ``should_stop()`` is asked before every step (a
    signal): True ends the loop early. Returns the fine-tuned model (as far as it got)."""
    import time

    from verltool_jax.algos.optimizer import OptimConfig, make_optimizer
    from verltool_jax.data.pipeline import SFTPipeline

    c = run.config
    steps = c.sft.steps
    opt = make_optimizer(
        OptimConfig(
            lr=c.sft.lr,
            warmup_steps=c.sft.warmup_steps,
            total_steps=max(steps, c.sft.warmup_steps + 1),
            schedule="constant",
            weight_decay=0.0,
            max_grad_norm=1.0,
        )
    )
    state = TrainState.create(run.model, opt, seed=c.trainer.seed)
    step_fn = make_sft_step(state.graphdef, opt)
    from verltool_jax.rollout.agent_loop import make_formatter

    pipe = SFTPipeline.from_files(
        run.files["sft"],
        run.tokenizer,
        fmt=c.data.format,
        seed=c.data.seed,
        observation_ids=make_formatter(run.tokenizer, c.rollout.rollout_config()),
    )
    t0 = time.perf_counter()
    for i in range(steps):
        if should_stop is not None and should_stop():
            log.info(f"[sft] stopped before step {i + 1}/{steps}")
            break
        batch = sft_batch(pipe.next_batch(c.sft.batch_size), run.pad_id, c.model.max_seq_len)
        state, m = step_fn(state, batch)
        if (i + 1) % max(1, steps // 10) == 0 or i + 1 == steps:
            metrics = {k: float(v) for k, v in jax.device_get(m).items()}
            log.info(
                f"[sft] step {i + 1}/{steps} loss {metrics['sft_loss']:.4f} "
                f"token-prob {metrics['sft_token_prob']:.3f} ({time.perf_counter() - t0:.1f}s)"
            )
            run.writer.write(i + 1, {f"sft/{k}": v for k, v in metrics.items()})
    return state.model()
