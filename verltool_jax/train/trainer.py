"""The training loop, top down.

    python -m verltool_jax.train --config configs/tiny_math.py [--config.key=value ...]

:func:`train` builds the run (``build.build_run``: model, tokenizer, data, reward pool,
tool server, writer), runs the supervised warm start if ``sft.steps > 0`` (``stage=sft``
stops there) or resumes from the latest checkpoint, starts the sampler and publishes the
policy, evaluates, and then loops. One RL step:

1. take ``trainer.batch_groups`` complete groups: from the :class:`TrajectoryQueue` that the
   :class:`RolloutProducer` fills continuously (async; at most ``rollout.max_staleness``
   versions old), or exactly this step's prompts (sync, the ablation baseline);
2. score them in the reward pool (off the event loop); a batch with too many failed
   trajectories stops here (see below);
3. check sampler-vs-trainer logprob parity on the tokens this version sampled;
4. compute group advantages (DAPO options) and run the jitted train step in a worker
   thread (rollout goes on meanwhile);
5. publish the new weights to every sampler and the queue (``PolicyPublisher``);
6. log, evaluate every ``trainer.eval_every`` steps, checkpoint every ``ckpt_every``.

Before each step the :class:`~verltool_jax.train.health.HealthMonitor` probes the tool
server (a server the run started is restarted if it died, and tool calls that found it
dead are retried); a batch with more than ``trainer.max_error_rate`` failed trajectories
is not trained on and not checkpointed, and a dependency that is down for good (an
external tool server, a dead sampler) stops the run with :class:`DependencyDown` before
any checkpoint of a degraded policy is written (``python -m verltool_jax.train`` exits 3).

Several processes (multi-host; every host runs the same command): each rolls out and
scores its share of the prompts, the scored groups are gathered into one global batch and
the step runs over the global mesh; process 0 alone writes (see
:mod:`verltool_jax.train.multihost`).

Ctrl-C (SIGINT) or SIGTERM finishes the current step, saves, and stops without the final
evaluation (exit 130); a later run with the same ``trainer.out_dir`` resumes exactly
(params, optimizer, step, rng, the data position including prompts in flight).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from verltool_jax.algos.advantages import compute_advantages
from verltool_jax.algos.credit import turn_discounted_advantages
from verltool_jax.algos.dapo import informative_groups, overlong_penalty
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.reporting import names
from verltool_jax.reporting.html_report import write_trajectory_report
from verltool_jax.reporting.learning_signal import NoSignalWatch, signal_metrics
from verltool_jax.reporting.plots import plot_metrics
from verltool_jax.reporting.progress import ProgressBar
from verltool_jax.rewards.compute import assign_rewards
from verltool_jax.rewards.visual_reward import add_curiosity_terms, curiosity_settings
from verltool_jax.rollout.producer import RolloutProducer
from verltool_jax.rollout.queue import TrajectoryQueue
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.run_config import RunConfig
from verltool_jax.tools_client import ToolClient
from verltool_jax.train import build, multihost
from verltool_jax.train.batch import (
    batch_from_trajectories,
    include_observations,
    observation_targets,
    row_images_of,
    shift_targets,
)
from verltool_jax.train.checkpoint import Checkpointer
from verltool_jax.train.console import console
from verltool_jax.train.disk import checkpoint_bytes, require_free_space
from verltool_jax.train.evaluate import evaluate, prompt_item, summarize
from verltool_jax.train.health import (
    HealthMonitor,
    ToolServerGuard,
    batch_health,
    trajectory_failed,
)
from verltool_jax.train.optimizer import make_optimizer
from verltool_jax.train.policy_version import PolicyPublisher
from verltool_jax.train.sft import run_sft
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step

log = logging.getLogger("verltool_jax.train")

PAD_MULTIPLE = 16  # sequence lengths are padded to a multiple of this (few jit shapes)


@dataclass
class TrainResult:
    """What :func:`train` returns: the summary written to ``summary.json``, the final
    train state, and the policy version the samplers serve."""

    summary: dict
    state: TrainState | None  # None when stopped during the SFT warm start
    policy_version: int


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes its step, saves and stops. A second
    signal raises KeyboardInterrupt at once."""

    def __init__(self, say) -> None:
        self.set = False
        self._say = say
        self._saved: dict = {}

    def install(self) -> None:
        def handler(signum, frame):
            if self.set:
                raise KeyboardInterrupt
            self.set = True
            self._say(
                f"[trainer] signal {signum}: finishing the current step, saving, "
                "stopping (Ctrl-C again to abort)"
            )

        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, handler)
        except ValueError:  # not in the main thread (e.g. under a test runner thread)
            pass

    def agreed(self) -> bool:
        """Whether to stop before the next step: a signal arrived (on any process, so all
        processes stop at the same step)."""
        if multihost.is_multi():
            self.set = multihost.any_true(self.set)
        return self.set

    def uninstall(self) -> None:
        """Give the signals back to the handlers that were there before."""
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved = {}


def sampler_parity(
    model, trajs: list[Trajectory], version: int, temperature: float, pad_id: int, max_len: int
) -> dict:
    """|trainer - sampler| logprob over the tokens that ``version`` sampled: the mean and
    max absolute difference of the trainer's logprobs (params of ``version``) of each
    trajectory's sampled tokens and the sampler's own."""
    trajs = [t for t in trajs if any(v == version for v in t.versions)]
    if not trajs:
        return {}
    b = batch_from_trajectories(trajs, [0.0] * len(trajs), pad_id, max_len, PAD_MULTIPLE)
    positions, row_images = row_images_of(b)  # the images the sampler saw, if any
    kw = {} if row_images is None else {"positions": positions, "row_images": row_images}
    lp = np.asarray(
        token_logprobs(
            model,
            b["input_ids"],
            b["attention_mask"],
            shift_targets(b["input_ids"]),
            temperature=temperature,
            **kw,
        )
    )
    diffs = []
    for i, t in enumerate(trajs):
        p = len(t.prompt_ids)
        for j, (m, v, s) in enumerate(zip(t.loss_mask, t.versions, t.logprobs)):
            if m and v == version:
                diffs.append(abs(float(lp[i, p - 1 + j]) - s))
    if not diffs:
        return {}
    d = np.asarray(diffs)
    return {
        "sync/logprob_diff_mean": float(d.mean()),
        "sync/logprob_diff_max": float(d.max()),
        "sync/parity_tokens": int(d.size),
    }


def advantages_for(rc: RunConfig, trajs: list[Trajectory]) -> tuple[np.ndarray, np.ndarray, dict]:
    """(advantages, keep-mask, metrics) of a batch, with the DAPO options applied:
    overlong penalty added to the rewards, dynamic sampling keeping informative groups.

    The estimator sees the kept trajectories only (the same values for the group
    estimators, whose groups are kept whole; the REINFORCE++ batch statistics are those
    of the trained batch, as verl filters before computing advantages); dropped ones get
    0. Token counts for the token-weighted estimators are the tokens the loss trains:
    the sampled ones, or the whole response when observations are not masked."""
    algo = rc.algo
    rewards = np.array([t.reward for t in trajs], np.float32)
    gids = [t.group_id for t in trajs]
    m = {}
    if algo.overlong_buffer_len > 0:
        pen = overlong_penalty(
            [len(t.response_ids) for t in trajs],
            rc.rollout.max_response_tokens,
            algo.overlong_buffer_len,
            algo.overlong_penalty_factor,
        )
        rewards = rewards + pen
        m["reward/overlong_penalty"] = float(pen.mean())
    keep = np.ones(len(trajs), bool)
    if algo.dynamic_sampling:
        keep = informative_groups(rewards, gids)
        m["batch/informative_frac"] = float(keep.mean())
    if rc.rollout.mask_observations:
        counts = np.array([sum(t.loss_mask) for t in trajs], np.float32)
    else:
        counts = np.array([len(t.response_ids) for t in trajs], np.float32)
    adv = np.zeros(len(trajs), np.float32)
    if keep.any():
        adv[keep] = compute_advantages(
            algo.adv_estimator,
            rewards[keep],
            [g for g, k in zip(gids, keep) if k],
            counts[keep],
        )
    return adv, keep, m


def train_on(
    rc: RunConfig, state: TrainState, train_step, trajs: list[Trajectory], pad_id: int
) -> tuple[TrainState, dict]:
    """Advantages, the padded batch and one jitted train step (runs in a worker thread).
    Failed trajectories (rollout error, killed reward) are left out."""
    trajs = [t for t in trajs if not trajectory_failed(t)]
    adv, keep, m = advantages_for(rc, trajs)
    m.update(
        signal_metrics(
            [t.reward or 0.0 for t in trajs],
            [t.group_id for t in trajs],
            [t.reward_info.get("acc", 0.0) for t in trajs],
            adv[keep] if keep.any() else [],
        )
    )
    if not keep.any():
        return state, dict(m, **{"batch/skipped": 1.0})
    use = [t for t, k in zip(trajs, keep) if k]
    adv = adv[keep]
    mb = rc.algo.mini_batch_size or len(use)
    # The step needs a multiple of the mini-batch; pad with zero-advantage copies whose
    # loss mask is zeroed, so they contribute nothing.
    pad = (-len(use)) % mb
    batch = batch_from_trajectories(
        use + use[:pad],
        np.concatenate([adv, adv[:pad] * 0]),
        pad_id,
        rc.model.max_seq_len,
        PAD_MULTIPLE,
    )
    if rc.algo.turn_discount < 1.0:
        # per-turn credit from the sampled tokens' turns (before the observation ablation
        # widens the mask; observation tokens take the weight of the turn before them)
        batch["advantages"] = np.asarray(
            turn_discounted_advantages(
                jnp.asarray(batch["advantages"]),
                jnp.asarray(batch["loss_mask"]),
                rc.algo.turn_discount,
            )
        )
    obs_trained = 0
    if not rc.rollout.mask_observations:
        # The observation-mask ablation: tool tokens are trained on, with the trainer's
        # own logprobs as their behaviour logprobs (the sampler never scored them), unless
        # the step reads no behaviour logprobs: then no extra forward pass over the batch
        # (it cost ~80 s a step on SmolLM2 in the masking ablation).
        obs = observation_targets(use + use[:pad], batch["input_ids"].shape[1])
        if obs.any():
            algo = rc.algo_for_run()
            lp = None
            if algo.reads_behaviour_logprobs:
                lp = np.asarray(
                    token_logprobs(
                        state.model(),
                        batch["input_ids"],
                        batch["attention_mask"],
                        shift_targets(batch["input_ids"]),
                        temperature=algo.temperature,
                    )
                )
            batch = include_observations(batch, obs, lp)
            obs_trained = int(obs[: len(use)].sum())
    if pad:
        batch["loss_mask"][len(use) :] = 0.0
    state, metrics = train_step(state, batch)
    metrics = {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items()}
    metrics.update(
        {
            "batch/size": len(use),
            "batch/seq_len": int(batch["input_ids"].shape[1]),
            "batch/adv_abs_mean": float(np.abs(adv).mean()),
            "batch/observation_tokens_trained": obs_trained,
        }
    )
    return state, dict(m, **metrics)


def rollout_metrics(trajs: list[Trajectory], version: int) -> dict:
    stats = summarize(trajs, "rollout")
    stats.update(
        {
            names.REWARD: stats["rollout/reward"],
            names.ACC: stats["rollout/acc"],
            "rollout/staleness_mean": float(
                np.mean([version - t.min_version for t in trajs if t.min_version >= 0] or [0])
            ),
            "rollout/errors": sum(t.termination == "error" for t in trajs),
        }
    )
    return stats


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def train(config: Any, echo: bool = True) -> TrainResult:
    """Run one experiment from its config (a ``ConfigDict`` or a ``RunConfig``).

    In a multi-host run (``JAX_COORDINATOR_ADDRESS`` & co. set, see
    :mod:`verltool_jax.train.multihost`) every process calls this with the same config; it
    joins the jax.distributed cluster first, and only process 0 prints."""
    multihost.start()
    echo = echo and multihost.is_primary()

    def say(msg: str) -> None:
        print(msg, file=console(), flush=True) if echo else log.info(msg)

    stop = StopFlag(say)
    stop.install()
    try:
        return _train(config, stop, say)
    finally:
        stop.uninstall()


def _train(config: Any, stop: StopFlag, say) -> TrainResult:
    t_start = time.perf_counter()
    with build.build_run(config) as run:
        rc = run.config
        multihost.check_supported(rc, run.mesh)
        algo = rc.algo_for_run()
        optimizer = make_optimizer(rc.optimizer_for_run())

        def new_state(model) -> TrainState:
            return multihost.globalize(
                TrainState.create(
                    model, optimizer, seed=rc.trainer.seed, with_reference=algo.kl_coef > 0
                ),
                run.mesh,
            )

        # ckpt_every = 0: only the final save (forced at the end, and on Ctrl-C).
        ckpt = Checkpointer(
            run.out / "checkpoints",
            save_every=rc.trainer.ckpt_every or rc.trainer.steps + 1,
            keep=rc.trainer.keep_ckpts,
        )
        # Room for one checkpoint before any work: the state's arrays (nothing allocated).
        if rc.stage == "rl" and multihost.is_primary():
            require_free_space(
                ckpt.directory,
                checkpoint_bytes(
                    lambda: TrainState.create(
                        run.model,
                        optimizer,
                        seed=rc.trainer.seed,
                        with_reference=algo.kl_coef > 0,
                    )
                ),
            )
        # A newest step cut short by a crash, truncated or corrupted is set aside (named
        # here) and the run resumes from the previous complete one.
        for r in ckpt.rejected:
            say(f"[trainer] {r.describe()}")
        prompts = run.prompt_pipeline()
        latest = ckpt.latest_step() if rc.checkpoint.resume else None
        resume_data: dict = {}
        if latest is not None:
            state, resume_data = ckpt.restore(new_state(run.model))
            resume_data = multihost.my_data_state(resume_data)
            if prompts is not None and "prompts" in resume_data:
                prompts.set_state(resume_data["prompts"])
            say(
                f"[trainer] resumed from {ckpt.directory} at step {latest}"
                + (", the newest complete checkpoint" if ckpt.rejected else "")
            )
        else:
            if ckpt.rejected and rc.checkpoint.resume:
                say("[trainer] no complete checkpoint is left: starting from the beginning")
            if rc.sft.steps > 0:
                run.model = run_sft(run, say, should_stop=stop.agreed)
                if stop.set:
                    # An unfinished warm start is not kept (no checkpoint: a resumed run
                    # would skip it); the same command runs it again from the start.
                    result = {
                        "eval_before": None,
                        "eval_after": None,
                        "steps": 0,
                        "interrupted": True,
                        "sft_interrupted": True,
                        "wall_s": time.perf_counter() - t_start,
                    }
                    if multihost.is_primary():
                        (run.out / "summary.json").write_text(json.dumps(result, indent=2))
                    say(
                        "[trainer] interrupted during the SFT warm start; nothing saved; "
                        "run the same command to start it again"
                    )
                    return TrainResult(result, None, 0)
            state = new_state(run.model)
        # The JAX sampler serves the trainer's own param buffers (no copy), so they must
        # not be donated to the next step while rollouts still read them.
        step = int(jax.device_get(state.step))
        if not run.eval_items and not (rc.stage == "rl" and step < rc.trainer.steps):
            # Nothing to sample (an SFT-only stage without a held-out set, or a finished
            # run resumed without one): no sampler is started (a vLLM engine takes a
            # minute and gigabytes).
            say("[trainer] no RL step to run and no held-out set: no sampler started")
            result = {
                "eval_before": None,
                "eval_after": None,
                "steps": step,
                "interrupted": stop.set,
            }
            last_trajs, eval_trajs, version = [], [], step
        else:
            train_step = make_train_step(
                algo,
                state.graphdef,
                optimizer,
                mesh=run.mesh,
                donate=build.sampler_backend(rc)[0] != "jax",
            )
            publisher = PolicyPublisher(run.open_sampler())
            publisher.publish_now(multihost.local_copy(state.sampler_params()), step)
            loop = RLLoop(
                run, algo, state, train_step, publisher, ckpt, prompts, resume_data, stop, say
            )
            result = asyncio.run(loop.run())
            state, last_trajs, eval_trajs = loop.state, loop.last_trajs, loop.eval_trajs
            version = publisher.version
        if multihost.is_primary():
            finish_reports(run, last_trajs, eval_trajs, say)
        if rc.checkpoint.export_hf:
            params = multihost.to_host(state.params)  # every process takes part
            if multihost.is_primary():
                build.hf_export(state.model(params), run.tokenizer, run.out / "hf_model")
    result["wall_s"] = time.perf_counter() - t_start
    if multihost.is_primary():
        (run.out / "summary.json").write_text(json.dumps(result, indent=2))
    if result["interrupted"]:
        say(
            f"[trainer] interrupted at step {result['steps']} after {result['wall_s']:.0f}s; "
            f"checkpoint saved in {run.out}; run the same command to resume"
        )
    else:
        say(
            f"[trainer] done in {result['wall_s']:.0f}s: held-out accuracy "
            f"{_fmt(result['eval_before'])} -> {_fmt(result['eval_after'])} "
            f"after {result['steps']} RL steps; outputs in {run.out}"
        )
    return TrainResult(result, state, version)


class RLLoop:
    """The asynchronous part of a run: evaluation and the RL step loop. Holds only what
    changes step to step (the train state); everything else is the run's."""

    def __init__(
        self, run, algo, state, train_step, publisher, ckpt, prompts, resume_data, stop, say
    ):
        self.run_, self.rc, self.algo = run, run.config, algo
        self.state, self.train_step, self.publisher = state, train_step, publisher
        self.ckpt, self.prompts, self.resume_data = ckpt, prompts, resume_data
        self.stop, self.say = stop, say
        self.last_trajs: list[Trajectory] = []
        self.uninformative = 0  # batches in a row that dynamic sampling dropped whole
        self.signal_watch = NoSignalWatch(
            self.rc.trainer.no_signal_steps, self.rc.trainer.no_signal_frac
        )
        self.eval_trajs: list[Trajectory] = []
        ts = self.rc.tool_server
        self.tool_guard = ToolServerGuard(
            run.tool_url,
            run.tool_process,
            max_restarts=ts.max_restarts,
            down_grace_s=ts.down_grace_s,
            say=say,
        )
        self.health = HealthMonitor(
            self.tool_guard,
            lambda: run.sampler,
            run.reward_pool,
            max_error_rate=self.rc.trainer.max_error_rate,
            max_skipped_steps=self.rc.trainer.max_skipped_steps,
            say=say,
        )

    @property
    def step(self) -> int:
        return int(jax.device_get(self.state.step))

    async def evaluate(self, client, tag: str) -> dict:
        run = self.run_
        if not run.eval_items:
            return {}
        t0 = time.perf_counter()
        # Several processes: each evaluates its strided share of the items, the results
        # are gathered (in item order) and the metrics taken over all of them.
        items = run.eval_items[multihost.process_index() :: multihost.process_count()]
        m, trajs = await evaluate(
            run.sampler,
            items,
            client,
            run.tokenizer,
            self.rc.rollout.rollout_config(),
            run.reward_pool,
            image_processor=run.image_processor,
        )
        if multihost.is_multi():
            gathered = await asyncio.to_thread(multihost.gather_groups, [[t] for t in trajs])
            trajs = [g[0] for g in gathered]
            m = summarize(trajs, "eval")
        m["time/eval_s"] = time.perf_counter() - t0
        h = batch_health(trajs)
        if h.rate > self.rc.trainer.max_error_rate:
            await self.health.check_dependencies(f"evaluation {tag}: {h.describe()}")
        m["eval/failed"] = h.failed
        run.writer.write(self.step, m)
        self.say(
            f"[eval:{tag}] step {self.step}: held-out accuracy {m['eval/acc']:.3f} "
            f"(reward {m['eval/reward']:.3f}, tool calls {m['eval/tool_calls']:.2f}, "
            f"n={m['eval/num']}, {m['time/eval_s']:.1f}s"
            + (f", {h.failed} FAILED: {h.describe()})" if h.failed else ")")
        )
        self.eval_trajs = trajs
        return m

    async def run(self) -> dict:
        rc = self.rc
        async with self.tool_guard.watch(
            ToolClient(self.run_.tool_url, timeout_s=rc.tool_server.timeout_s + 30)
        ) as client:
            start = self.step
            before = await self.evaluate(client, "start" if start else "after-sft")
            if rc.stage == "rl" and start < rc.trainer.steps:
                await self.rl(client)
            # An interrupted run is not finished: no final evaluation (decided by every
            # process together: a signal may reach one process after the last step).
            # No RL step in this call (stage sft, or a finished run resumed): the policy is
            # the one just evaluated, so its figures stand (no second pass over the set).
            if self.stopping():
                after = {}
            elif self.step == start:
                after = before
            else:
                after = await self.evaluate(client, "final")
        return {
            "eval_before": before.get("eval/acc"),
            "eval_after": after.get("eval/acc"),
            "steps": self.step,
            "interrupted": self.stop.set,
        }

    async def rl(self, client) -> None:
        rc, run = self.rc, self.run_
        # Prompts that were in flight at the checkpoint are rolled out again first.
        # Several processes: group ids carry the process (groups meet in one batch), and
        # each process takes its share of the shared prompt stream (strided by process
        # index; the position is the pipeline's count of prompts handed out, which its
        # state saves, so a resumed process keeps its share).
        tag = f"p{multihost.process_index()}" if multihost.is_multi() else ""
        replay = [
            (i, prompt_item(e, prefix=f"{tag}r-"))
            for i, e in (
                (i, self.prompts.example_at(i)) for i in self.resume_data.get("replay", [])
            )
            if e is not None
        ]
        serial = iter(range(1, 1 << 62))
        fresh = (
            (e.index, prompt_item(e, prefix=f"{tag}s{next(serial)}-"))
            for e in self.prompts
            if not tag or multihost.my_share(self.prompts.consumed - 1)
        )
        groups_per_step = multihost.check_batch_groups(rc.trainer.batch_groups)
        queue = None
        if rc.rollout.mode == "async":
            queue = TrajectoryQueue(
                max_groups=max(4, 4 * rc.trainer.batch_groups),
                max_staleness=rc.rollout.max_staleness,
                groups_per_batch=groups_per_step,
                start_version=self.step,
            )
            self.publisher.queue = queue
        producer = RolloutProducer(
            fresh,
            n_samples=rc.rollout.n_samples,
            sampler=run.sampler,
            tool_client=client,
            tokenizer=run.tokenizer,
            cfg=rc.rollout.rollout_config(),
            queue=queue,
            replay=replay,
            image_processor=run.image_processor,
        )
        producing = asyncio.create_task(producer.run()) if queue is not None else None
        bar = ProgressBar(
            rc.trainer.steps,
            initial=self.step,
            enabled=rc.logging.progress_bar and multihost.is_primary(),
            file=console(),
        )
        t_last = time.perf_counter()
        try:
            while self.step < rc.trainer.steps and not self.stopping():
                await self.health.before_step()
                t0 = time.perf_counter()
                if queue is not None:
                    groups = await queue.get_batch(groups_per_step)
                else:
                    groups = await producer.next_groups(groups_per_step)
                t_wait = time.perf_counter() - t0
                producer.consumed(groups)
                t_reward, reward_terms = await self.score(groups)
                if hasattr(self.prompts, "observe"):  # a curriculum: levels follow pass rates
                    reward_terms.update(self.prompts.observe(groups))
                # Several processes: every process gets every process's scored groups and
                # trains on the same global batch (each places its own rows).
                groups = await asyncio.to_thread(multihost.gather_groups, groups)
                if not await self.health.admit([t for g in groups for t in g], self.step):
                    continue  # not trained on, not checkpointed
                metrics = await self.rl_step(groups, t_wait, t_reward, t_last)
                metrics.update(reward_terms)
                if metrics.get("batch/skipped"):
                    self.nothing_to_train(producer)
                    continue  # not a step: sample another batch
                metrics["batch/uninformative_batches"] = self.uninformative
                self.uninformative = 0
                metrics[names.TIME_STEP] = time.perf_counter() - t_last
                t_last = time.perf_counter()
                if queue is not None:
                    metrics.update(queue.summary())
                metrics.update(self.health.metrics())
                warning = self.signal_watch.update(metrics)
                if warning:
                    self.say(f"[trainer] step {self.step}: {warning}")
                if self.step % rc.trainer.log_every == 0:
                    run.writer.write(self.step, metrics)
                line = bar.update(self.step, metrics)
                if not rc.logging.progress_bar:
                    self.say(line)
                if (
                    rc.trainer.eval_every
                    and self.step % rc.trainer.eval_every == 0
                    and self.step < rc.trainer.steps
                ):
                    await self.evaluate(client, f"step{self.step}")
                self.ckpt.maybe_save(self.state, self.data_state(producer))
        finally:
            bar.close()
            if producing is not None:
                await queue.close()
                producing.cancel()
                await asyncio.gather(producing, return_exceptions=True)
            # Nothing lost: save the final position (also after Ctrl-C).
            if self.ckpt.latest_step() != self.step:
                self.ckpt.maybe_save(self.state, self.data_state(producer), force=True)
            self.ckpt.wait()

    async def score(self, groups: list[list[Trajectory]]) -> tuple[float, dict]:
        """Rewards of the batch from the reward pool (off the event loop), plus the group
        terms ``reward.curiosity_*`` asks for; ``(seconds, metrics of the group terms)``."""
        run = self.run_
        trajs = [t for g in groups for t in g]
        t0 = time.perf_counter()
        assign_rewards(trajs, await run.reward_pool.score_async(trajs, run.tokenizer))
        terms = {}
        curiosity = curiosity_settings(self.rc.reward)
        if curiosity is not None:  # group terms: every group is whole here
            terms = add_curiosity_terms(groups, curiosity)
        return time.perf_counter() - t0, terms

    def stopping(self) -> bool:
        """Whether to stop before the next step (:meth:`StopFlag.agreed`)."""
        return self.stop.agreed()

    def nothing_to_train(self, producer: RolloutProducer) -> None:
        """A batch with no trajectory left to train on (dynamic sampling dropped every
        group: all rewards in each group equal): the step is not taken, nothing is logged,
        evaluated or saved as a step, and another batch is sampled, up to
        ``algo.dynamic_sampling_max_batches`` in a row (then the state is saved and the run
        stops with an error)."""
        self.uninformative += 1
        limit = self.rc.algo.dynamic_sampling_max_batches
        self.say(
            f"[trainer] step {self.step + 1}: no group in the batch has mixed rewards "
            f"(dynamic sampling): sampling another ({self.uninformative} in a row"
            + (f", at most {limit})" if limit else ")")
        )
        if limit and self.uninformative >= limit:
            self.ckpt.maybe_save(self.state, self.data_state(producer), force=True)
            raise RuntimeError(
                f"dynamic sampling: {self.uninformative} batches in a row had no group with "
                f"mixed rewards (algo.dynamic_sampling_max_batches={limit}); the training "
                f"problems are too hard (or too easy) for this policy: choose easier data, "
                f"more samples per prompt (rollout.n_samples), or raise the limit (0: none). "
                f"The state at step {self.step} is saved in {self.ckpt.directory}"
            )

    def data_state(self, producer: RolloutProducer) -> dict:
        """The data position to checkpoint: the pipeline plus prompts started but not yet
        trained on (they are rolled out again first on resume). Several processes: every
        process's position, under ``processes`` in process order (a collective)."""
        mine = {
            "prompts": self.prompts.get_state(),
            "replay": sorted(set(producer.in_flight_keys())),
            "sft_done": True,
        }
        return multihost.data_state(mine)

    async def rl_step(
        self, groups: list[list[Trajectory]], t_wait: float, t_reward: float, t_last: float
    ) -> dict:
        rc, run = self.rc, self.run_
        trajs = [t for g in groups for t in g]
        version = self.step
        parity: dict = {}
        if rc.trainer.parity_every and version % rc.trainer.parity_every == 0:
            parity = await asyncio.to_thread(
                sampler_parity,
                self.state.model(),
                trajs,
                version,
                self.algo.temperature,
                run.pad_id,
                rc.model.max_seq_len,
            )
        t1 = time.perf_counter()
        self.state, metrics = await asyncio.to_thread(
            train_on, rc, self.state, self.train_step, trajs, run.pad_id
        )
        t_train = time.perf_counter() - t1
        if metrics.get("batch/skipped"):
            return metrics  # the policy did not change: nothing to publish
        params = await asyncio.to_thread(multihost.local_copy, self.state.sampler_params())
        t_sync = await self.publisher.publish(params, self.step)
        self.last_trajs = trajs
        if rc.logging.dump_trajectories and multihost.is_primary():
            dump_trajectories(run.out / "trained" / f"step_{self.step:05d}.jsonl", trajs)
        sampled = sum(int(sum(t.loss_mask)) for t in trajs)
        metrics.update(rollout_metrics(trajs, version))
        metrics.update(parity)
        metrics.update(self.publisher.sync_metrics())
        metrics.update(
            {
                names.TIME_ROLLOUT_WAIT: t_wait,
                names.TIME_TRAIN: t_train,
                names.TIME_SYNC: t_sync,
                "time/reward_s": t_reward,
                "policy/version": self.publisher.version,
                names.TOKENS_PER_S: sampled / max(1e-9, time.perf_counter() - t_last),
            }
        )
        return metrics


def dump_trajectories(path, trajs: list[Trajectory]) -> None:
    """Write ``trajs`` (every field but images and extras) as JSON lines to ``path``;
    ``load_trajectories`` reads them back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for t in trajs:
            f.write(json.dumps(t.to_json()) + "\n")


def load_trajectories(path) -> list[Trajectory]:
    """The trajectories ``dump_trajectories`` wrote to ``path``."""
    with open(path) as f:
        return [Trajectory.from_json(json.loads(line)) for line in f if line.strip()]


def finish_reports(run, last_trajs: list, eval_trajs: list, say) -> None:
    """The PNG plot of reward/accuracy and the HTML page of sample trajectories."""
    rc = run.config
    run.writer.close()
    if rc.logging.plot:
        try:
            plot_metrics(run.writer.jsonl_path, run.out / "metrics.png", title=rc.trainer.out_dir)
        except ValueError as e:  # nothing to plot yet (e.g. zero RL steps)
            say(f"[trainer] no plot: {e}")
    k = rc.logging.report_trajectories
    trajs = list(eval_trajs)[:k] + list(last_trajs)[:k]
    if trajs:
        write_trajectory_report(
            trajs,
            run.out / "trajectories.html",
            title=f"{rc.trainer.out_dir}: held-out (greedy) and last training batch",
            tokenizer=run.tokenizer,
        )
