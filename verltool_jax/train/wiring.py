"""The step loop's collaborators, made once in dependency order by :func:`wire`: the
jitted train step, the trajectory queue, the policy publisher (which pushes the start
version), the tool client and its guard, the health monitor, the rollout producer: our
agent loop's, or with ``rollout.producer="gateway"`` a ``GatewayProducer`` whose agent
program talks to the gateway (served by ``RLLoop.train`` on the run's sampler)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tool_server.client import ToolClient
from verltool_jax.algos.config import AlgoConfig
from verltool_jax.gateway.producer import GatewayProducer
from verltool_jax.reporting.learning_signal import NoSignalWatch
from verltool_jax.rollout.ledger import PromptLedger
from verltool_jax.rollout.producer import RolloutProducer
from verltool_jax.rollout.queue import TrajectoryQueue
from verltool_jax.train import build, multihost
from verltool_jax.train.checkpoint import Checkpointer
from verltool_jax.train.evaluate import prompt_item
from verltool_jax.train.health import HealthMonitor, ToolServerGuard
from verltool_jax.train.policy_version import PolicyPublisher
from verltool_jax.train.signals import StopFlag
from verltool_jax.train.start import RunStart
from verltool_jax.train.startup import part
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step

log = logging.getLogger("verltool_jax.train")


@dataclass(frozen=True)
class LoopDeps:
    """What ``trainer.RLLoop`` works with. ``queue`` is None in sync rollout;
    ``producer`` is None when the run takes no RL step (only evaluation); ``evaluator``
    is the producer the held-out evaluation goes through (the gateway's, also when no
    RL step is left, so that a resumed finished run evaluates its agent program)."""

    run: Any  # build.Run
    algo: AlgoConfig
    train_step: Callable
    publisher: PolicyPublisher
    ckpt: Checkpointer
    prompts: Any
    client: ToolClient
    tool_guard: ToolServerGuard
    health: HealthMonitor
    queue: TrajectoryQueue | None
    producer: RolloutProducer | None
    groups_per_step: int
    signal_watch: NoSignalWatch
    stop: StopFlag
    gateway: Any = None  # verltool_jax.gateway.Gateway with rollout.producer="gateway"
    evaluator: RolloutProducer | None = None


def wire(run: Any, start: RunStart, state: TrainState, version: int, stop: StopFlag) -> LoopDeps:
    """The :class:`LoopDeps` of a run whose policy is at ``version``; starts the sampler
    and publishes ``state``'s weights to it as ``version``."""
    rc = run.config
    train_step = make_train_step(
        start.algo,
        state.graphdef,
        start.optimizer,
        mesh=run.mesh,
        # The JAX sampler serves the trainer's own param buffers (no copy): they must not
        # be donated to the next step while rollouts still read them.
        donate=build.sampler_backend(rc)[0] != "jax",
        value_optimizer=start.value_optimizer,
    )
    rl = rc.stage == "rl" and version < rc.trainer.steps
    groups = multihost.check_batch_groups(rc.trainer.batch_groups)
    queue = None
    if rl and rc.rollout.mode == "async":
        queue = TrajectoryQueue(
            max_groups=max(4, 4 * rc.trainer.batch_groups),
            max_staleness=rc.rollout.max_staleness,
            groups_per_batch=groups,
            start_version=version,
        )
    # waits for the engine start
    lora_sync, why = build.lora_sync_mode(rc)
    if rc.model.lora_rank > 0:
        log.info("[trainer] LoRA sync: %s (%s)", lora_sync, why)
    publisher = PolicyPublisher(run.open_sampler(), queue, lora_sync)
    with part("first weight push"):
        publisher.publish_now(multihost.local_copy(state.sampler_params()), version)
    ts = rc.tool_server
    guard = ToolServerGuard(
        run.tool_url,
        run.tool_process,
        max_restarts=ts.max_restarts,
        down_grace_s=ts.down_grace_s,
    )
    client = guard.watch(ToolClient(run.tool_url, timeout_s=ts.timeout_s + 30))
    health = HealthMonitor(
        guard,
        lambda: run.sampler,
        run.reward_pool,
        max_error_rate=rc.trainer.max_error_rate,
        max_skipped_steps=rc.trainer.max_skipped_steps,
    )
    producer: RolloutProducer | None = None
    gateway = None
    if rl or rc.rollout.producer == "gateway":
        kw: dict[str, Any] = dict(
            n_samples=rc.rollout.n_samples,
            sampler=run.sampler,
            tool_client=client,
            tokenizer=run.tokenizer,
            cfg=rc.rollout.rollout_config(),
            queue=queue,
            image_processor=run.image_processor,
            ledger=PromptLedger.restore(start.resume_data, _replay_item(start)),
        )
        prompts = _fresh_prompts(start.prompts) if rl else iter(())
        if rc.rollout.producer == "gateway":
            gp = gateway_producer(run, prompts, kw)
            producer, gateway = gp, gp.gateway
        else:
            producer = RolloutProducer(prompts, **kw)
    evaluator = producer
    if not rl:
        producer = None  # no RL step left: the gateway's producer only evaluates
    watch = NoSignalWatch(rc.trainer.no_signal_steps, rc.trainer.no_signal_frac)
    return LoopDeps(
        run, start.algo, train_step, publisher, start.ckpt, start.prompts, client, guard,
        health, queue, producer, groups, watch, stop, gateway, evaluator,
    )  # fmt: skip


def gateway_producer(run: Any, prompts: Any, kw: dict) -> GatewayProducer:
    """A ``GatewayProducer`` over the run's sampler and tokenizer: the gateway (not yet
    serving: ``RLLoop.train`` serves it) and the bound agent program of ``gateway.*``."""
    from verltool_jax.gateway import Gateway
    from verltool_jax.gateway.program import bind_agent, load_agent

    rc, g = run.config, run.config.gateway
    cfg = g.gateway_config(rc.sampler.max_model_len, rc.rollout.max_response_tokens)
    gateway = Gateway(run.sampler, run.tokenizer, cfg)
    r = rc.rollout  # the loss's logprobs assume the run's sampling, whatever the program asks
    gateway.sampling = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k}
    agent = bind_agent(load_agent(g.agent), run.tool_url, g.agent_args)
    return GatewayProducer(prompts, gateway=gateway, agent=agent, **kw)


# Several processes: group ids carry the process (groups meet in one batch), and each
# process takes its share of the shared prompt stream (strided by process index; the
# position is the pipeline's count of prompts handed out, which its state saves, so a
# resumed process keeps its share).
def _tag() -> str:
    return f"p{multihost.process_index()}" if multihost.is_multi() else ""


def _replay_item(start: RunStart):
    """How the ledger rebuilds a prompt that was in flight at the checkpoint (rolled out
    again first): row ``key``, group id ``r<serial>-<key>``; None if it no longer fits."""

    def item(key, serial: int):
        e = start.prompts.example_at(int(key))
        return None if e is None else prompt_item(e, prefix=f"{_tag()}r{serial}-")

    return item


def _fresh_prompts(prompts: Any):
    tag, serial = _tag(), iter(range(1, 1 << 62))
    return (
        (e.index, prompt_item(e, prefix=f"{tag}s{next(serial)}-"))
        for e in prompts
        if not tag or multihost.my_share(prompts.consumed - 1)
    )
