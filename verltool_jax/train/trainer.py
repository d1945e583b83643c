"""The training loop: tool server + sampler pool + rollout workers + the JAX train step.

    python -m verltool_jax.train --config configs/tiny_math.py [--config.key=value ...]

One RL step: take ``trainer.batch_groups`` complete groups from the
:class:`TrajectoryQueue` (asynchronous mode: rollout workers fill it continuously, one
asyncio task per trajectory, at most ``rollout.max_staleness`` versions ahead; sync mode:
the batch-synchronous baseline rolls out exactly this step's prompts), score them
(reward pool, off the event loop), compute group advantages, run the jitted train step
(in a worker thread, so rollout goes on), push the new weights to every sampler
(version + 1), log, and checkpoint every ``trainer.ckpt_every`` steps.

Before RL, ``sft.steps > 0`` runs the supervised warm start (``stage=sft`` runs only
that). Ctrl-C (SIGINT) or SIGTERM stops after the current step and saves a checkpoint
first; a later run with the same ``trainer.out_dir`` resumes from it (params, optimizer,
step, rng, and the data position, including prompts that were in flight).
"""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from verltool_jax.algos.advantages import compute_advantages
from verltool_jax.algos.dapo import informative_groups, overlong_penalty
from verltool_jax.cli.sections import split_section
from verltool_jax.data.pipeline import PromptPipeline, SFTPipeline
from verltool_jax.models.hf_io import load_hf
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.reporting import names
from verltool_jax.reporting.html_report import write_trajectory_report
from verltool_jax.reporting.metrics_writer import MetricsWriter
from verltool_jax.reporting.plots import plot_metrics
from verltool_jax.reporting.progress import ProgressBar
from verltool_jax.rewards.compute import RewardPool, assign_rewards
from verltool_jax.rollout.agent_loop import PromptItem, make_formatter, rollout_group
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.queue import QueueClosed, TrajectoryQueue
from verltool_jax.rollout.sync_baseline import run_rollout_sync
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.tools_client import ToolClient
from verltool_jax.train import build
from verltool_jax.train.batch import batch_from_trajectories, shift_targets
from verltool_jax.train.checkpoint import Checkpointer
from verltool_jax.train.config import algo_config
from verltool_jax.train.evaluate import evaluate, prompt_item, prompt_items, summarize
from verltool_jax.train.optimizer import make_optimizer, optimizer_config
from verltool_jax.train.sft import make_sft_step, sft_batch
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step

log = logging.getLogger("verltool_jax.train")

PAD_MULTIPLE = 16     # sequence lengths are padded to a multiple of this (few jit shapes)


def rollout_config(config) -> RolloutConfig:
    """The :class:`RolloutConfig` fields of ``config.rollout`` (others are trainer knobs)."""
    mine, _ = split_section(config.rollout, RolloutConfig)
    return RolloutConfig.from_mapping(mine)


def sampler_parity(model, trajs: list[Trajectory], version: int, temperature: float,
                   pad_id: int, max_len: int) -> dict:
    """|trainer - sampler| logprob over the tokens that ``version`` sampled.

    The trainer's logprobs (params of ``version``) of each trajectory's sampled tokens
    versus the sampler's own; the mean and max absolute difference.
    """
    trajs = [t for t in trajs if any(v == version for v in t.versions)]
    if not trajs:
        return {}
    b = batch_from_trajectories(trajs, [0.0] * len(trajs), pad_id, max_len, PAD_MULTIPLE)
    lp = np.asarray(token_logprobs(model, b["input_ids"], b["attention_mask"],
                                   shift_targets(b["input_ids"]), temperature=temperature))
    diffs = []
    for i, t in enumerate(trajs):
        p = len(t.prompt_ids)
        for j, (m, v, s) in enumerate(zip(t.loss_mask, t.versions, t.logprobs)):
            if m and v == version:
                diffs.append(abs(float(lp[i, p - 1 + j]) - s))
    if not diffs:
        return {}
    d = np.asarray(diffs)
    return {"sync/logprob_diff_mean": float(d.mean()), "sync/logprob_diff_max": float(d.max()),
            "sync/parity_tokens": int(d.size)}


class Trainer:
    """Owns one run's components; :meth:`run` does SFT (optional), RL, evaluation."""

    def __init__(self, config, echo: bool = True) -> None:
        self.config = config
        self.out = Path(config.trainer.out_dir)
        self.echo = echo
        self._stop = False
        self.summary: dict = {}

    # ------------------------------------------------------------------ helpers
    def say(self, msg: str) -> None:
        """Progress for the user: printed (``echo``) or logged, never both."""
        if self.echo:
            print(msg, flush=True)
        else:
            log.info(msg)

    def _install_signal_handlers(self) -> None:
        def handler(signum, frame):
            if self._stop:       # second Ctrl-C: stop now
                raise KeyboardInterrupt
            self._stop = True
            self.say(f"[trainer] signal {signum}: finishing the current step, saving, "
                     "stopping (Ctrl-C again to abort)")
        try:
            signal.signal(signal.SIGINT, handler)
            signal.signal(signal.SIGTERM, handler)
        except ValueError:       # not in the main thread (e.g. under a test runner thread)
            pass

    def request_stop(self) -> None:
        self._stop = True

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        c = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.json").write_text(c.to_json(indent=2))
        # Data first: a bad question file or retrieval index fails before any model work.
        self.files = build.prepare_task_files(c, self.out)
        self.model_dir = build.prepare_model_dir(c, self.out)
        self.tokenizer = build.load_tokenizer(c, self.model_dir)
        self.pad_id = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                       else self.tokenizer.eos_token_id)
        self.model = load_hf(self.model_dir, dtype=c.model.dtype, param_dtype=c.model.param_dtype,
                             remat_policy=c.model.remat_policy)
        self.rollout_cfg = rollout_config(c)
        self.algo = algo_config(c.algo, temperature=float(c.rollout.temperature) or 1.0)
        steps = int(c.trainer.steps)
        self.optimizer = make_optimizer(optimizer_config(
            c.optimizer, total_steps=max(steps, int(c.optimizer.warmup_steps) + 1)))
        self.max_len = int(c.model.max_seq_len)
        self.writer = MetricsWriter(self.out, tensorboard=c.logging.tensorboard,
                                    wandb=c.logging.wandb, wandb_project=c.logging.wandb_project,
                                    config=c.to_dict())
        self.reward_pool = RewardPool.from_config(c.reward)
        self.eval_items = []
        if self.files["eval"]:
            pipe = PromptPipeline.from_files(self.files["eval"], self.tokenizer, fmt=c.data.format,
                                             shuffle=False, num_epochs=1,
                                             max_prompt_tokens=c.rollout.max_prompt_tokens)
            self.eval_items = prompt_items(pipe.next_batch(int(c.data.max_eval_examples)), "eval")

    def _new_state(self, model) -> TrainState:
        return TrainState.create(model, self.optimizer, seed=int(self.config.trainer.seed),
                                 with_reference=self.algo.kl_coef > 0)

    # ------------------------------------------------------------------ SFT
    def run_sft(self) -> dict:
        """The supervised warm start; returns its last metrics. Updates ``self.model``."""
        c = self.config
        opt = make_optimizer(optimizer_config(
            lr=float(c.sft.lr), warmup_steps=int(c.sft.warmup_steps),
            total_steps=max(int(c.sft.steps), int(c.sft.warmup_steps) + 1),
            schedule="constant", weight_decay=0.0, max_grad_norm=1.0))
        state = TrainState.create(self.model, opt, seed=int(c.trainer.seed))
        step_fn = make_sft_step(state.graphdef, opt)
        pipe = SFTPipeline.from_files(self.files["sft"], self.tokenizer, fmt=c.data.format,
                                      seed=int(c.data.seed))
        t0 = time.perf_counter()
        metrics: dict = {}
        for i in range(int(c.sft.steps)):
            batch = sft_batch(pipe.next_batch(int(c.sft.batch_size)), self.pad_id, self.max_len,
                              PAD_MULTIPLE)
            state, m = step_fn(state, batch)
            if (i + 1) % max(1, int(c.sft.steps) // 10) == 0 or i + 1 == int(c.sft.steps):
                metrics = {k: float(v) for k, v in jax.device_get(m).items()}
                self.say(f"[sft] step {i + 1}/{c.sft.steps} loss {metrics['sft_loss']:.4f} "
                         f"token-prob {metrics['sft_token_prob']:.3f} "
                         f"({time.perf_counter() - t0:.1f}s)")
                self.writer.write(i + 1, {f"sft/{k}": v for k, v in metrics.items()})
        self.model = state.model()
        return metrics

    # ------------------------------------------------------------------ rollout
    async def _produce(self, queue: TrajectoryQueue, pending: dict, replay: list) -> None:
        """Asynchronous rollout workers: start a group whenever the queue admits one."""
        formatter = make_formatter(self.tokenizer, self.rollout_cfg)
        n = int(self.config.rollout.n_samples)
        serial = 0
        tasks: set = set()

        async def one_group(item: PromptItem) -> None:
            group = await rollout_group(item, n, self.sampler, self.tool_client, self.tokenizer,
                                        self.rollout_cfg, formatter)
            try:
                await queue.put_group(group)
            except QueueClosed:
                return

        try:
            while True:
                await queue.admit()
                if replay:
                    example = replay.pop(0)
                else:
                    example = await asyncio.to_thread(next, self.prompts)
                serial += 1
                item = prompt_item(example, prefix=f"s{serial}-")
                pending[item.group_id] = example.index
                t = asyncio.create_task(one_group(item))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        except (QueueClosed, asyncio.CancelledError, StopIteration):
            pass
        finally:
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _sync_batch(self, replay: list) -> list[list[Trajectory]]:
        """The batch-synchronous baseline: roll out exactly this step's prompts."""
        k = int(self.config.trainer.batch_groups)
        examples = replay[:k]
        del replay[:k]
        examples += self.prompts.next_batch(k - len(examples))
        items = [prompt_item(e, prefix=f"b{self.step_count}-") for e in examples]
        return await run_rollout_sync(items, int(self.config.rollout.n_samples), self.sampler,
                                      self.tool_client, self.tokenizer, self.rollout_cfg)

    # ------------------------------------------------------------------ one step
    def _advantages(self, trajs: list[Trajectory]) -> tuple[np.ndarray, np.ndarray, dict]:
        """(advantages, keep-mask, metrics) with DAPO options applied."""
        rewards = np.array([t.reward for t in trajs], np.float32)
        gids = [t.group_id for t in trajs]
        m = {}
        if self.algo.overlong_buffer_len > 0:
            pen = overlong_penalty([len(t.response_ids) for t in trajs],
                                   self.rollout_cfg.max_response_tokens,
                                   self.algo.overlong_buffer_len,
                                   self.algo.overlong_penalty_factor)
            rewards = rewards + pen
            m["reward/overlong_penalty"] = float(pen.mean())
        keep = np.ones(len(trajs), bool)
        if self.algo.dynamic_sampling:
            keep = informative_groups(rewards, gids)
            m["batch/informative_frac"] = float(keep.mean())
        adv = compute_advantages(self.algo.adv_estimator, rewards, gids)
        return adv, keep, m

    def _train_on(self, trajs: list[Trajectory]) -> dict:
        """Advantages, batch, the jitted train step (runs in a worker thread)."""
        adv, keep, m = self._advantages(trajs)
        if not keep.any():
            return dict(m, **{"batch/skipped": 1.0})
        use = [t for t, k in zip(trajs, keep) if k]
        adv = adv[keep]
        mb = self.algo.mini_batch_size or len(use)
        # The step needs a multiple of the mini-batch; pad with zero-advantage copies
        # (their loss mask is zeroed, so they contribute nothing).
        pad = (-len(use)) % mb
        batch = batch_from_trajectories(use + use[:pad], np.concatenate([adv, adv[:pad] * 0]),
                                        self.pad_id, self.max_len, PAD_MULTIPLE)
        if pad:
            batch["loss_mask"][len(use):] = 0.0
        self.state, metrics = self.train_step(self.state, batch)
        metrics = {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items()}
        metrics["batch/size"] = len(use)
        metrics["batch/seq_len"] = int(batch["input_ids"].shape[1])
        metrics["batch/adv_abs_mean"] = float(np.abs(adv).mean())
        return dict(m, **metrics)

    async def _rl_step(self, groups: list[list[Trajectory]], t_wait: float) -> dict:
        trajs = [t for g in groups for t in g]
        t0 = time.perf_counter()
        assign_rewards(trajs, await self.reward_pool.score_async(trajs, self.tokenizer))
        t_reward = time.perf_counter() - t0
        version = int(self.step_count)
        parity: dict = {}
        every = int(self.config.trainer.parity_every)
        if every and self.step_count % every == 0:
            model = self.state.model()
            parity = await asyncio.to_thread(sampler_parity, model, trajs, version,
                                             self.algo.temperature, self.pad_id, self.max_len)
        t1 = time.perf_counter()
        metrics = await asyncio.to_thread(self._train_on, trajs)
        t_train = time.perf_counter() - t1
        t2 = time.perf_counter()
        await asyncio.to_thread(self.sampler.update_weights, self.state.params, version + 1)
        if self.queue is not None:
            await self.queue.set_version(version + 1)
        t_sync = time.perf_counter() - t2
        self.step_count += 1
        stats = summarize(trajs, "rollout")
        sampled = sum(int(sum(t.loss_mask)) for t in trajs)
        metrics.update(stats)
        metrics.update(parity)
        metrics.update({
            names.REWARD: stats["rollout/reward"], names.ACC: stats["rollout/acc"],
            names.TIME_ROLLOUT_WAIT: t_wait, names.TIME_TRAIN: t_train,
            names.TIME_SYNC: t_sync, "time/reward_s": t_reward,
            names.TIME_STEP: time.perf_counter() - self._t_last,
            "rollout/staleness_mean": float(np.mean([version - t.min_version for t in trajs
                                                     if t.min_version >= 0] or [0])),
            "rollout/errors": sum(t.termination == "error" for t in trajs),
            "policy/version": version + 1,
        })
        metrics[names.TOKENS_PER_S] = sampled / max(1e-9, time.perf_counter() - self._t_last)
        self._t_last = time.perf_counter()
        self._last_trajs = trajs
        if self.queue is not None:
            metrics.update(self.queue.summary())
        return metrics

    def _data_state(self, pending: dict) -> dict:
        """The data position to checkpoint: the pipeline plus prompts started but not yet
        trained on (they are rolled out again first on resume)."""
        return {"prompts": self.prompts.get_state(), "replay": sorted(set(pending.values())),
                "sft_done": True}

    async def _eval(self, step: int, tag: str) -> dict:
        if not self.eval_items:
            return {}
        t0 = time.perf_counter()
        m, trajs = await evaluate(self.sampler, self.eval_items, self.tool_client,
                                  self.tokenizer, self.rollout_cfg, self.reward_pool)
        m["time/eval_s"] = time.perf_counter() - t0
        self.writer.write(step, m)
        self.say(f"[eval:{tag}] step {step}: held-out accuracy {m['eval/acc']:.3f} "
                 f"(reward {m['eval/reward']:.3f}, tool calls {m['eval/tool_calls']:.2f}, "
                 f"n={m['eval/num']}, {m['time/eval_s']:.1f}s)")
        self._eval_trajs = trajs
        return m

    # ------------------------------------------------------------------ the run
    async def _rl(self, start_step: int, data_state: dict) -> None:
        c = self.config
        steps = int(c.trainer.steps)
        replay_idx = list(data_state.get("replay", []))
        # Re-create the examples that were in flight at the checkpoint (same rows).
        replay = [e for e in map(self.prompts.example_at, replay_idx) if e is not None]
        pending: dict = {}
        self.step_count = start_step
        self._t_last = time.perf_counter()
        mode = c.rollout.mode
        self.queue = None
        producer = None
        if mode == "async":
            self.queue = TrajectoryQueue(max_groups=max(4, 4 * int(c.trainer.batch_groups)),
                                         max_staleness=int(c.rollout.max_staleness),
                                         groups_per_batch=int(c.trainer.batch_groups),
                                         start_version=start_step)
            producer = asyncio.create_task(self._produce(self.queue, pending, replay))
        bar = ProgressBar(steps, initial=start_step, enabled=bool(c.logging.progress_bar))
        eval_every = int(c.trainer.eval_every)
        try:
            while self.step_count < steps and not self._stop:
                t0 = time.perf_counter()
                if mode == "async":
                    groups = await self.queue.get_batch(int(c.trainer.batch_groups))
                    for g in groups:
                        pending.pop(g[0].group_id, None)
                else:
                    groups = await self._sync_batch(replay)
                t_wait = time.perf_counter() - t0
                metrics = await self._step_and_log(groups, t_wait, bar)
                if eval_every and self.step_count % eval_every == 0 and self.step_count < steps:
                    await self._eval(self.step_count, f"step{self.step_count}")
                saved = self.ckpt.maybe_save(self.state, self._data_state(pending))
                if saved:
                    metrics["checkpoint/saved"] = self.step_count
        finally:
            bar.close()
            if producer is not None:
                await self.queue.close()
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
            # Nothing lost: save the final position (also after Ctrl-C).
            if self.ckpt.latest_step() != int(jax.device_get(self.state.step)):
                self.ckpt.maybe_save(self.state, self._data_state(pending), force=True)
            self.ckpt.wait()

    async def _step_and_log(self, groups, t_wait: float, bar: ProgressBar) -> dict:
        metrics = await self._rl_step(groups, t_wait)
        if self.step_count % max(1, int(self.config.trainer.log_every)) == 0:
            self.writer.write(self.step_count, metrics)
        line = bar.update(self.step_count, metrics)
        if not self.config.logging.progress_bar:
            self.say(line)
        return metrics

    async def _run_async(self) -> dict:
        c = self.config
        async with ToolClient(self._tool_url, timeout_s=float(c.tool_server.timeout_s) + 30) \
                as client:
            self.tool_client = client
            start_step = int(jax.device_get(self.state.step))
            before = await self._eval(start_step, "start" if start_step else "after-sft")
            if c.stage == "rl" and start_step < int(c.trainer.steps):
                await self._rl(start_step, self._resume_data)
            after = await self._eval(self.step_count if c.stage == "rl" else 0, "final")
        return {"eval_before": before.get("eval/acc"), "eval_after": after.get("eval/acc"),
                "steps": int(jax.device_get(self.state.step))}

    def run(self) -> dict:
        """Set up, warm-start, train, evaluate; returns a summary dict."""
        c = self.config
        self._install_signal_handlers()
        t_start = time.perf_counter()
        self.setup()
        # ckpt_every = 0: only the final save (forced at the end of RL, and on Ctrl-C).
        every = int(c.trainer.ckpt_every) or int(c.trainer.steps) + 1
        self.ckpt = Checkpointer(self.out / "checkpoints", save_every=every,
                                 keep=int(c.trainer.keep_ckpts))
        self._resume_data: dict = {}
        self.prompts = PromptPipeline.from_files(
            self.files["train"], self.tokenizer, fmt=c.data.format, seed=int(c.data.seed),
            shuffle=bool(c.data.shuffle), max_prompt_tokens=c.rollout.max_prompt_tokens) \
            if self.files["train"] else None
        latest = self.ckpt.latest_step() if c.checkpoint.resume else None
        if latest is not None:
            self.state, self._resume_data = self.ckpt.restore(self._new_state(self.model))
            if self.prompts is not None and "prompts" in self._resume_data:
                self.prompts.set_state(self._resume_data["prompts"])
            self.model = self.state.model()
            self.say(f"[trainer] resumed from {self.ckpt.directory} at step {latest}")
        else:
            if int(c.sft.steps) > 0:
                self.run_sft()
            self.state = self._new_state(self.model)
        # The JAX sampler serves the trainer's own param buffers (no copy), so they must not
        # be donated to the next step while rollouts still read them.
        self.train_step = make_train_step(self.algo, self.state.graphdef, self.optimizer,
                                          donate=c.sampler.backend != "jax")
        self.say(f"[trainer] starting the {c.sampler.backend} sampler")
        self.sampler = build.make_sampler(c, self.model_dir, self.tokenizer)
        try:
            version = int(jax.device_get(self.state.step))
            self.sampler.update_weights(self.state.params, version)
            with build.tool_server_url(c) as url:
                self._tool_url = url
                result = asyncio.run(self._run_async())
        finally:
            self.sampler.close()
            self.reward_pool.close()
        self.finish_reports()
        if c.checkpoint.export_hf:
            build.hf_export(self.state.model(), self.tokenizer, self.out / "hf_model")
        result["wall_s"] = time.perf_counter() - t_start
        self.summary = result
        (self.out / "summary.json").write_text(json.dumps(result, indent=2))
        self.say(f"[trainer] done in {result['wall_s']:.0f}s: held-out accuracy "
                 f"{_fmt(result['eval_before'])} -> {_fmt(result['eval_after'])} "
                 f"after {result['steps']} RL steps; outputs in {self.out}")
        return result

    def finish_reports(self) -> None:
        """The PNG plot of reward/accuracy and the HTML page of sample trajectories."""
        c = self.config
        self.writer.close()
        if c.logging.plot:
            try:
                plot_metrics(self.writer.jsonl_path, self.out / "metrics.png",
                             title=f"{c.trainer.out_dir}")
            except ValueError as e:       # nothing to plot yet (e.g. zero RL steps)
                self.say(f"[trainer] no plot: {e}")
        trajs = list(getattr(self, "_last_trajs", []))[: int(c.logging.report_trajectories)]
        evals = list(getattr(self, "_eval_trajs", []))[: int(c.logging.report_trajectories)]
        if trajs or evals:
            write_trajectory_report(evals + trajs, self.out / "trajectories.html",
                                    title=f"{c.trainer.out_dir}: held-out (greedy) and last "
                                          f"training batch", tokenizer=self.tokenizer)


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def train(config, echo: bool = True) -> dict:
    """Run one experiment from its config; returns the summary."""
    return Trainer(config, echo=echo).run()
