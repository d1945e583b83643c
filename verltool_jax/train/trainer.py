"""The training loop, top down.

    python -m verltool_jax.train --config configs/tiny_math.py [--config.key=value ...]

:func:`train` builds the run (``build.build_run``), starts it (``start.start_run``: the
SFT warm start or the resumed checkpoint), wires the loop once (:func:`make_rl_loop`),
evaluates, runs the RL steps and finishes (``summary.finish``: ``summary.json`` and the
last line, on every way out). One RL step (:meth:`RLLoop.rl`), phase by phase:

1. **take groups**: ``trainer.batch_groups`` complete groups from the ``TrajectoryQueue``
   that the ``RolloutProducer`` fills (async; at most ``rollout.max_staleness`` versions
   old), or exactly this step's prompts (sync, the ablation baseline);
2. **score**: rewards from the reward pool (once per gateway episode, combined with the
   agent program's by ``gateway.reward``), group terms, curriculum levels; several
   processes gather everyone's groups into one global batch;
3. **admit**: a batch with more than ``trainer.max_error_rate`` failed trajectories is not
   trained on, its prompts are rolled out again (``health.HealthMonitor``; a dependency
   down for good raises ``DependencyDown``, exit 3); after the train step
   ``accounting.settle`` ends each group in the data accounting (``rollout.ledger``);
4. **make batch**: ``batch.make_batch`` (advantages, DAPO keep-mask, padding); None when
   dynamic sampling kept nothing: not a step, another batch is sampled;
5. **train**: ``step.train_on`` in a worker thread (rollout goes on meanwhile), with the
   sampler-vs-trainer parity from its own forward (``train.parity``) or the token pass;
6. **publish**: the new weights to every sampler and the queue (``PolicyPublisher``, the
   owner of the policy version, a host integer);
7. **log**, then **evaluate** every ``trainer.eval_every`` and **checkpoint** every
   ``trainer.ckpt_every`` steps.

Ctrl-C or SIGTERM finishes the step, saves, stops without the final evaluation (exit 130);
the same ``trainer.out_dir`` resumes exactly. Several processes: ``train.multihost``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import jax

from verltool_jax import metric_names as names
from verltool_jax.gateway.program import serving
from verltool_jax.reporting.progress import ProgressBar
from verltool_jax.rewards.compute import score_episodes
from verltool_jax.rewards.visual_reward import add_curiosity_terms, curiosity_settings
from verltool_jax.rollout.producer import RolloutProducer
from verltool_jax.rollout.trajectory import Trajectory, dump_trajectories
from verltool_jax.runtime.console import CONSOLE, console, console_lines
from verltool_jax.train import build, multihost, parity, startup, token_stats
from verltool_jax.train.accounting import check_accounting, settle
from verltool_jax.train.batch import RLBatch, make_batch
from verltool_jax.train.evaluate import evaluate_run
from verltool_jax.train.metrics import StepTimer, rollout_metrics
from verltool_jax.train.signals import StopFlag
from verltool_jax.train.start import start_run
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import train_on
from verltool_jax.train.summary import RunSummary, finish, finish_reports
from verltool_jax.train.wiring import LoopDeps, wire

log = logging.getLogger("verltool_jax.train")


@dataclass
class TrainResult:
    """What :func:`train` returns: the run's summary (also in ``summary.json``), the final
    train state (None when stopped during the SFT warm start) and the policy version."""

    summary: RunSummary
    state: TrainState | None
    policy_version: int


def train(config: Any, echo: bool = True, started_at: float | None = None) -> TrainResult:
    """Run one experiment from its config (a ``ConfigDict`` or a ``RunConfig``). Several
    processes (``JAX_COORDINATOR_ADDRESS`` & co.) each call it with the same config.
    ``started_at``: the command's ``perf_counter`` time (start-up counts from it)."""
    multihost.start()
    echo = echo and multihost.is_primary()

    stop = StopFlag()
    stop.install()
    try:
        with console_lines(enabled=echo):
            return _train(config, stop, started_at)
    finally:
        stop.uninstall()


def _train(config: Any, stop: StopFlag, started_at: float | None) -> TrainResult:
    t_start, _ = time.perf_counter(), startup.begin(started_at)
    with build.build_run(config, start_sampler=True) as run:
        rc, start = run.config, start_run(run, stop)
        state, version, last, evals = start.state, 0, [], []
        if state is None:
            summary = RunSummary(interrupted=True, sft_interrupted=True)
        else:
            version = int(jax.device_get(state.step))  # the one device read of the version
            if run.eval_items or (rc.stage == "rl" and version < rc.trainer.steps):
                loop = RLLoop(wire(run, start, state, version, stop), state)
                summary = asyncio.run(loop.train())
                state, version, last, evals = loop.state, loop.version, loop.last, loop.evals
            else:  # nothing to sample: no sampler (a vLLM engine takes a minute and GBs)
                log.info("[trainer] no RL step to run and no held-out set: no sampler started")
                summary = RunSummary(steps=version, interrupted=stop.set)
            if multihost.is_primary():
                finish_reports(run, last, evals)
            if rc.checkpoint.export_hf:
                params = multihost.to_host(state.params)  # every process takes part
                if multihost.is_primary():
                    build.hf_export(state.model(params), run.tokenizer, run.out / "hf_model")
    summary.wall_s, summary.startup = time.perf_counter() - t_start, startup.end()
    finish(run.out, summary)
    return TrainResult(summary, state, version)


@dataclass
class RLLoop:
    """The asynchronous part of a run: evaluation and the RL step loop. Holds what
    changes step to step (the train state); its collaborators (``deps``) are made once
    by :func:`wiring.wire`."""

    deps: LoopDeps
    state: TrainState
    last: list[Trajectory] = field(default_factory=list)  # the last batch trained on
    evals: list[Trajectory] = field(default_factory=list)  # the last evaluation's
    uninformative: int = 0  # batches in a row that dynamic sampling dropped whole
    timer: StepTimer = field(default_factory=StepTimer)

    @property
    def version(self) -> int:
        """The policy version (= RL steps taken): the publisher's host integer."""
        assert self.deps.publisher.version is not None  # wire() published it
        return self.deps.publisher.version

    async def train(self) -> RunSummary:
        """Evaluate, run the RL steps, evaluate again (not after an interruption, decided
        by every process together; not when no step ran: the figures stand)."""
        d = self.deps
        async with d.client, serving(d.gateway, d.run.config.gateway):
            start = self.version
            before = await self.evaluate("start" if start else "after-sft")
            if d.producer is not None:
                await self.rl(d.producer)
            if d.stop.agreed():
                after = {}
            else:
                after = before if self.version == start else await self.evaluate("final")
        acc, data = before.get(names.EVAL_ACC), check_accounting(d.producer)
        return RunSummary(acc, after.get(names.EVAL_ACC), self.version, d.stop.set, data=data)

    async def rl(self, producer: RolloutProducer) -> None:
        d, rc = self.deps, self.deps.run.config
        bar = ProgressBar(
            rc.trainer.steps,
            initial=self.version,
            enabled=rc.logging.progress_bar and multihost.is_primary(),
            file=console(),
        )
        producing = d.queue.watch(asyncio.create_task(producer.run())) if d.queue else None
        self.timer = StepTimer()  # the first step's clock starts here
        try:
            while self.version < rc.trainer.steps and not d.stop.agreed():
                await d.health.before_step()
                groups = await self.take_groups(producer)
                trajs, reward_terms = await self.score(groups)
                if not await d.health.admit(trajs, self.version):
                    await settle(producer, d.queue, groups, skipped=True)
                    continue  # not trained on, not checkpointed: rolled out again
                with self.timer.phase(names.TIME_BATCH):
                    args = (rc, d.algo, trajs, d.run.pad_id, self.state.model)
                    batch = await asyncio.to_thread(make_batch, *args)
                if batch is None:
                    await settle(producer, d.queue, groups)
                    self.nothing_to_train()
                    continue  # not a step: sample another batch
                metrics = await self.train_batch(batch, trajs)
                await settle(producer, d.queue, groups, batch)
                await self.publish()
                self.log_step(metrics | reward_terms, trajs, bar)
                await self.evaluate_and_checkpoint()
        finally:
            bar.close()
            if producing is not None and d.queue is not None:  # both or neither
                await d.queue.close()
                producing.cancel()
                await asyncio.gather(producing, return_exceptions=True)
            if d.ckpt.latest_step() != self.version:  # the final position, also on Ctrl-C
                d.ckpt.maybe_save(self.state, self.data_state(), force=True)
            d.ckpt.wait()

    async def take_groups(self, producer: RolloutProducer) -> list[list[Trajectory]]:
        d = self.deps
        with self.timer.phase(names.TIME_ROLLOUT_WAIT):
            if d.queue is not None:
                groups = await d.queue.get_batch(d.groups_per_step)
            else:
                groups = await producer.next_groups(d.groups_per_step)
        return groups

    async def score(self, groups: list[list[Trajectory]]) -> tuple[list[Trajectory], dict]:
        """Rewards from the reward pool (off the event loop), the group terms that
        ``reward.curiosity_*`` asks for, the curriculum's levels; then every process's
        groups (several processes train on one global batch). ``(trajs, metrics)``."""
        run, terms = self.deps.run, {}
        with self.timer.phase(names.TIME_REWARD):
            trajs = [t for g in groups for t in g]
            rule = run.config.gateway.reward  # episodes of the gateway: docs/gateway.md
            await score_episodes(run.reward_pool, trajs, run.tokenizer, rule)
            curiosity = curiosity_settings(run.config.reward)
            if curiosity is not None:  # group terms: every group is whole here
                terms = add_curiosity_terms(groups, curiosity)
        if hasattr(self.deps.prompts, "observe"):  # a curriculum: levels follow pass rates
            terms.update(self.deps.prompts.observe(groups))
        groups = await asyncio.to_thread(multihost.gather_groups, groups)
        return [t for g in groups for t in g], terms

    async def train_batch(self, batch: RLBatch, trajs: list[Trajectory]) -> dict:
        """The train step in a worker thread; parity from its forward (``train.parity``) or
        the token pass, which records the report's token stats (``train.token_stats``)."""
        d, rc, passed, v = self.deps, self.deps.run.config, {}, self.version
        need = parity.due(rc.trainer, v) and not parity.score_in_step(rc.trainer, d.algo, batch, v)
        if token_stats.pass_due(rc, v, need):
            args = (self.state.model(), trajs, v, d.algo, d.run.pad_id, rc.model.max_seq_len)
            with self.timer.phase(names.TIME_PARITY):
                size = (rc.trainer.shared_prompt, rc.logging, need)
                passed = await asyncio.to_thread(token_stats.token_pass, *args, *size)
        with self.timer.phase(names.TIME_TRAIN):
            self.state, metrics = await asyncio.to_thread(train_on, d.train_step, self.state, batch)
        return parity.from_step(metrics) | passed | rollout_metrics(trajs, v)

    async def publish(self) -> None:
        """The new weights to the sampler(s) and the queue, as version + 1."""
        params = await asyncio.to_thread(multihost.local_copy, self.state.sampler_params())
        seconds = await self.deps.publisher.publish(params, self.version + 1)
        self.timer.record(names.TIME_SYNC, seconds)

    def log_step(self, metrics: dict, trajs: list[Trajectory], bar: ProgressBar) -> None:
        d, rc, v = self.deps, self.deps.run.config, self.version
        self.last = trajs
        if rc.logging.dump_trajectories and multihost.is_primary():
            dump_trajectories(d.run.out / "trained" / f"step_{v:05d}.jsonl", trajs)
        metrics[names.BATCH_UNINFORMATIVE], self.uninformative = self.uninformative, 0
        metrics.update(d.publisher.sync_metrics())
        metrics["policy/version"] = v
        metrics.update(self.timer.metrics(sum(int(sum(t.loss_mask)) for t in trajs)))
        if d.queue is not None:
            metrics.update(d.queue.summary())
        metrics.update(d.health.metrics())
        warning = d.signal_watch.update(metrics)
        if warning:
            log.info(f"[trainer] step {v}: {warning}")
        if v % rc.trainer.log_every == 0:
            d.run.writer.write(v, metrics)
        line = bar.update(v, metrics)
        if not rc.logging.progress_bar:
            log.info(line, extra=CONSOLE)

    async def evaluate_and_checkpoint(self) -> None:
        t, v = self.deps.run.config.trainer, self.version
        if t.eval_every and v % t.eval_every == 0 and v < t.steps:
            await self.evaluate(f"step{v}")
        self.deps.ckpt.maybe_save(self.state, self.data_state())

    async def evaluate(self, tag: str) -> dict:
        d = self.deps
        m, trajs = await evaluate_run(d.run, d.client, d.health, self.version, tag, d.evaluator)
        self.evals = trajs or self.evals
        return m

    def nothing_to_train(self) -> None:
        """Dynamic sampling dropped every group (all rewards in each group equal): no
        step, nothing logged or saved; another batch is sampled, up to
        ``algo.dynamic_sampling_max_batches`` in a row (then save and stop with an error)."""
        d, self.uninformative = self.deps, self.uninformative + 1
        limit = d.run.config.algo.dynamic_sampling_max_batches
        log.info(
            f"[trainer] step {self.version + 1}: no group in the batch has mixed rewards "
            f"(dynamic sampling): sampling another ({self.uninformative} in a row"
            + (f", at most {limit})" if limit else ")")
        )
        if limit and self.uninformative >= limit:
            d.ckpt.maybe_save(self.state, self.data_state(), force=True)
            raise RuntimeError(
                f"dynamic sampling: {self.uninformative} batches in a row had no group with "
                f"mixed rewards (algo.dynamic_sampling_max_batches={limit}); the training "
                f"problems are too hard (or too easy) for this policy: choose easier data, "
                f"more samples per prompt (rollout.n_samples), or raise the limit (0: none). "
                f"The state at step {self.version} is saved in {d.ckpt.directory}"
            )

    def data_state(self) -> dict:
        """The data position to checkpoint: the pipeline, the prompts in flight and their
        trajectories (gone on with first on resume) and the data accounting, taken
        together (``RolloutProducer.data_state``); a collective with several processes."""
        d = self.deps
        assert d.producer is not None  # only RL steps save
        return multihost.data_state(d.producer.data_state(d.prompts.get_state))
