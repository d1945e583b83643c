"""The start of a run, before any RL step: the optimizer and the train state, the
checkpointer (with room for one checkpoint checked first), the prompt pipeline, and the
state to start from (with the critic when ``algo.adv_estimator="gae"``: a copy of the
policy it starts from, ``models.value``): the latest complete checkpoint (resume, with the data position), the
SFT warm start (``sft.steps > 0``), or the initial policy."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import optax

from verltool_jax.algos.config import AlgoConfig
from verltool_jax.algos.optimizer import make_optimizer
from verltool_jax.train import multihost
from verltool_jax.train.checkpoint import Checkpointer
from verltool_jax.train.disk import checkpoint_bytes, require_free_space
from verltool_jax.train.sft import run_sft
from verltool_jax.train.signals import StopFlag
from verltool_jax.train.startup import part
from verltool_jax.train.state import TrainState

log = logging.getLogger(__name__)


@dataclass
class RunStart:
    """Where a run starts: ``state`` is None when a signal stopped the SFT warm start
    (nothing is saved; the same command runs it again)."""

    state: TrainState | None
    algo: AlgoConfig
    optimizer: optax.GradientTransformation
    value_optimizer: optax.GradientTransformation | None  # the critic's (gae), else None
    ckpt: Checkpointer
    prompts: Any  # the prompt pipeline (``Run.prompt_pipeline``), None without train data
    resume_data: dict  # this process's data position from the checkpoint ({} if fresh)


def start_run(run: Any, stop: StopFlag) -> RunStart:
    """The :class:`RunStart` of ``run`` (a ``build.Run``)."""
    rc = run.config
    multihost.check_supported(rc, run.mesh)
    algo = rc.algo_for_run()
    optim = rc.optimizer_for_run()
    optimizer = make_optimizer(optim)
    value_optimizer = (
        make_optimizer(algo.critic_optimizer_config(optim)) if algo.uses_critic else None
    )

    def new_state(model) -> TrainState:
        state = TrainState.create(
            model, optimizer, seed=rc.trainer.seed, with_reference=algo.kl_coef > 0
        )
        if value_optimizer is None:
            return state
        from verltool_jax.models.value import value_model_from_policy

        return state.with_critic(value_model_from_policy(model, run.mesh), value_optimizer)

    # ckpt_every = 0: only the final save (forced at the end, and on Ctrl-C).
    ckpt = Checkpointer(
        run.out / "checkpoints",
        save_every=rc.trainer.ckpt_every or rc.trainer.steps + 1,
        keep=rc.trainer.keep_ckpts,
    )
    # Room for one checkpoint before any work: the state's arrays (nothing allocated).
    if rc.stage == "rl" and multihost.is_primary():
        require_free_space(ckpt.directory, checkpoint_bytes(lambda: new_state(run.model)))
    # A newest step cut short by a crash, truncated or corrupted is set aside (named
    # here) and the run resumes from the previous complete one.
    for r in ckpt.rejected:
        log.info(f"[trainer] {r.describe()}")
    with part("data"):
        prompts = run.prompt_pipeline()
    start = RunStart(None, algo, optimizer, value_optimizer, ckpt, prompts, {})
    latest = ckpt.latest_step() if rc.checkpoint.resume else None
    if latest is not None:
        with part("resume"):
            template = multihost.globalize(new_state(run.model), run.mesh)
            start.state, data = ckpt.restore(template)
        start.resume_data = multihost.my_data_state(data)
        if prompts is not None and "prompts" in start.resume_data:
            prompts.set_state(start.resume_data["prompts"])
        log.info(
            f"[trainer] resumed from {ckpt.directory} at step {latest}"
            + (", the newest complete checkpoint" if ckpt.rejected else "")
        )
        return start
    if ckpt.rejected and rc.checkpoint.resume:
        log.info("[trainer] no complete checkpoint is left: starting from the beginning")
    if rc.sft.steps > 0:
        with part("sft warm start"):
            run.model = run_sft(run, should_stop=stop.agreed)
        if stop.set:
            return start  # an unfinished warm start is not kept
    start.state = multihost.globalize(new_state(run.model), run.mesh)
    return start
