"""Killing the trainer's dependencies mid-run: the tool server it started (restarted, the
turns in flight retried), an external tool server (a clear error, exit 3, the last good
checkpoint kept), the sampler engine (the failed batch is not trained on, the run stops),
a reward worker (the pool replaces it; the lost item is a failure, not a 0 reward), and
SIGTERM (exit 130, no final evaluation). Real tool server, real JAX sampler, real
trainer on the tiny_math smoke config."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import support.rewards_testlib as rewards_testlib  # noqa: F401  (registers the test rewards)
from support.scripted_sampler import ScriptedSampler

from tool_server.client import ToolClient
from tool_server.launcher import ToolServerProcess, run_server
from verltool_jax.cli import parse_command_line
from verltool_jax.rewards import RewardItem, RewardPool
from verltool_jax.rollout.agent_loop import PromptItem, run_rollout
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.train import trainer as trainer_mod
from verltool_jax.train.health import DependencyDown, ToolServerGuard, batch_health

REPO = Path(__file__).resolve().parents[2]
PROMPT = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"


def _argv(out_dir: Path, *overrides: str) -> list[str]:
    return [
        "--config",
        str(REPO / "configs/tiny_math.py") + ":smoke",
        "--config.sampler.backend=jax",
        "--config.sft.steps=0",
        f"--config.trainer.out_dir={out_dir}",
        "--config.logging.progress_bar=false",
        "--config.logging.plot=false",
        "--config.logging.tensorboard=false",
        "--config.data.max_eval_examples=2",
    ] + [f"--config.{o}" for o in overrides]


def _ckpt_steps(out: Path) -> list[int]:
    d = out / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def _processes_mentioning(text: str) -> list[str]:
    r = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if text in line and "ps -eo" not in line]


def _after_step(monkeypatch, step: int, action) -> None:
    """Run ``action(loop)`` once, right after RL step ``step`` has been published."""
    orig = trainer_mod.RLLoop.publish

    async def publish(self):
        await orig(self)
        if self.version == step:
            action(self)

    monkeypatch.setattr(trainer_mod.RLLoop, "publish", publish)


def _kill(proc) -> int:
    pid = proc.pid
    os.kill(pid, signal.SIGKILL)
    proc.proc.wait()
    return pid


def test_started_tool_server_killed_is_restarted_and_turns_retried(tok, caplog):
    caplog.set_level(logging.INFO, logger="verltool_jax")
    server = ToolServerProcess(["python_code"], timeout=10)
    url = server.start()
    first_pid, first_scratch = server.pid, server.scratch
    guard = ToolServerGuard(url, server, max_restarts=2)
    killed: list[int] = []

    def script(rid: str, turn: int) -> str:
        if turn == 0 and not killed:  # the server dies while the turns are in flight
            killed.append(_kill(server))
        return "<python>print(6*7)</python>" if turn == 0 else "<answer>42</answer>"

    async def go():
        async with guard.watch(ToolClient(url, retries=1, backoff_s=0.05)) as client:
            items = [
                PromptItem(tok.encode(PROMPT, add_special_tokens=False), group_id=f"p{i}")
                for i in range(3)
            ]
            return await run_rollout(
                items,
                4,
                ScriptedSampler(tok, script, delay_s=0.01),
                client,
                tok,
                RolloutConfig(max_turns=3, max_response_tokens=128),
            )

    try:
        groups = asyncio.run(go())
        trajs = [t for g in groups for t in g]
        assert killed == [first_pid]
        assert [t.termination for t in trajs] == ["eos"] * 12, [t.error for t in trajs]
        assert all(t.tool_calls == 1 and t.observations[0].strip() == "42" for t in trajs)
        assert guard.restarts == 1 and server.restarts == 1 and guard.down is None
        assert server.alive and server.pid != first_pid and server.url == url  # same port
        assert any("restarted" in s for s in caplog.messages), caplog.messages
        # the dead server left nothing behind: its scratch dir and sandboxed workers are gone
        assert not os.path.exists(first_scratch)
        time.sleep(0.5)
        assert not _processes_mentioning(first_scratch)
    finally:
        server.stop()
    assert not os.path.exists(first_scratch) and server.scratch is None


def test_external_tool_server_down_stops_the_run_and_keeps_the_checkpoint(
    tmp_path, monkeypatch, capfd
):
    from verltool_jax.train.__main__ import EXIT_DEPENDENCY_DOWN, main

    out = tmp_path / "run"
    handler_before = signal.getsignal(signal.SIGTERM)
    with ToolServerProcess(["python_code"], timeout=10) as server:
        _after_step(monkeypatch, 1, lambda loop: _kill(server))
        t0 = time.monotonic()
        rc = main(
            _argv(
                out,
                f"tool_server.url={server.url}",
                "tool_server.down_grace_s=1.0",
                "trainer.steps=3",
                "trainer.keep_ckpts=1",
            )
        )
        elapsed = time.monotonic() - t0
    console = capfd.readouterr().out
    assert rc == EXIT_DEPENDENCY_DOWN == 3
    assert f"the tool server at {server.url} (tool_server.url) has been unreachable" in console
    assert "rerun the same command to resume" in console
    assert "[eval:final]" not in console and "[trainer] done" not in console
    # the good policy of step 1 is the checkpoint kept; nothing after it was saved
    assert _ckpt_steps(out) == [1]
    assert not (out / "summary.json").exists()
    assert elapsed < 120
    # signal handlers are given back after the run
    assert signal.getsignal(signal.SIGTERM) is handler_before


@pytest.mark.slow
def test_dead_sampler_batch_is_not_trained_and_the_run_stops(tmp_path, monkeypatch):
    out = tmp_path / "run"

    def crash_the_engine(loop):
        def dead(*a, **kw):
            raise RuntimeError("engine killed by the test")

        loop.deps.run.sampler._prefill = loop.deps.run.sampler._decode = dead

    _after_step(monkeypatch, 1, crash_the_engine)
    cfg = parse_command_line(_argv(out, "trainer.steps=3", "rollout.mode=sync")).config
    with pytest.raises(
        DependencyDown,
        match=r"the sampler died \(step 2: 4/4 trajectories "
        r"failed .*SamplerDeadError",
    ):
        trainer_mod.train(cfg, echo=False)
    assert _ckpt_steps(out) == [1]  # step 2's failed batch never trained
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "policy/version" in r]
    assert [r["policy/version"] for r in trained] == [1]
    assert all(r["rollout/errors"] == 0 for r in trained)


def test_started_server_killed_then_sigterm_restarts_and_exits_130(tmp_path, monkeypatch, capfd):
    from verltool_jax.train.__main__ import EXIT_INTERRUPTED, main

    out = tmp_path / "run"
    handler_before = signal.getsignal(signal.SIGTERM)
    servers: list = []
    scratch: list[str] = []
    orig_start = ToolServerProcess.start

    def start(self, port=None):
        url = orig_start(self, port)
        servers.append(self)
        scratch.append(self.scratch)
        return url

    monkeypatch.setattr(ToolServerProcess, "start", start)
    killed: list[int] = []

    def act(loop):
        if not killed:
            killed.append(_kill(servers[0]))

    orig = trainer_mod.RLLoop.publish

    async def publish(self):
        await orig(self)
        if self.version == 1:
            act(self)  # kill -9 the server we started
        if self.version == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # then interrupt the run

    monkeypatch.setattr(trainer_mod.RLLoop, "publish", publish)
    rc = main(_argv(out, "trainer.steps=4"))
    console = capfd.readouterr().out
    assert rc == EXIT_INTERRUPTED == 130
    assert "[health] the tool server (pid" in console and "restarted it" in console
    assert "interrupted at step 2" in console
    assert "[eval:final]" not in console and "[trainer] done" not in console
    assert _ckpt_steps(out) == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps"] == 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["health/tool_server_restarts"] for r in records if "policy/version" in r] == [0, 1]
    # both servers (the killed one and its replacement) left no scratch dir behind
    assert len(scratch) == 2 and not any(os.path.exists(s) for s in scratch)
    assert signal.getsignal(signal.SIGTERM) is handler_before


def test_killed_reward_worker_is_replaced_and_its_item_is_a_failure():
    items = [
        RewardItem("x", "1", "test_sleep", {"sleep_s": 1.5}),
        ("<answer>6</answer>", {"data_source": "tiny_math", "reward_model": {"ground_truth": "6"}}),
    ]
    with RewardPool(
        num_workers=1,
        timeout_s=2.0,
        grace_s=1.0,
        warm_up=False,
        reward_modules=("support.rewards_testlib",),
    ) as pool:
        pool.score([items[1]])  # workers up
        (worker,) = pool.worker_pids()
        threading.Timer(0.5, lambda: os.kill(worker, signal.SIGKILL)).start()
        res = pool.score(items)
        assert res[0].info.get("killed") is True and res[0].score == 0.0
        assert pool.restarts == 1  # (test_rewards.py: the fresh pool scores)
    trajs = [
        Trajectory(
            trajectory_id=f"t{i}",
            group_id="g",
            prompt_ids=[1],
            termination="eos",
            reward_info=dict(r.info),
        )
        for i, r in enumerate(res)
    ]
    h = batch_health(trajs)
    # (the queued item is killed too when the replacement worker starts too late)
    killed = sum(bool(r.info.get("killed")) for r in res)
    assert h.total == 2 and h.failed == killed >= 1
    assert h.reasons == [("reward scoring killed (reward worker died or wedged)", killed)]


def test_a_reward_worker_killed_while_idle_never_hangs_the_pool():
    """Workers waiting for work are SIGKILLed between batches (the chaos soak's reward
    fault; a worker killed while it waits holds the task queue's lock, which hung
    ``multiprocessing.Pool.terminate`` forever): the next batches are scored, by a fresh
    pool, in bounded time, and every item is scored or failed, none lost."""
    rows = [
        ("<answer>6</answer>", {"data_source": "tiny_math", "reward_model": {"ground_truth": "6"}})
    ] * 4
    with RewardPool(num_workers=2, timeout_s=2.0, grace_s=2.0, warm_up=False) as pool:
        assert [r.score for r in pool.score(rows)] == [1.0] * 4  # workers up, idle now
        for pid in pool.worker_pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        got: list = []
        scorer = threading.Thread(target=lambda: got.extend(pool.score(rows) + pool.score(rows)))
        scorer.start()
        scorer.join(120)
        assert not scorer.is_alive(), "scoring hung after a worker was killed while idle"
        assert len(got) == 8 and all(r.score in (0.0, 1.0) for r in got)
        assert [r.score for r in got[4:]] == [1.0] * 4  # the fresh pool scores
        assert pool.restarts <= 1


def test_external_server_back_within_grace_is_waited_for(caplog):
    caplog.set_level(logging.INFO, logger="verltool_jax")

    async def go(url, restart):
        guard = ToolServerGuard(url, None, down_grace_s=30, probe_every_s=0.2)
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, restart)
        return await guard.recover(), guard

    with run_server(["python_code"], timeout=5) as url:
        port = int(url.rsplit(":", 1)[1])
    box: list = []
    server = ToolServerProcess(["python_code"], timeout=5)
    starter = threading.Thread(target=lambda: box.append(server.start(port=port)))
    try:
        ok, guard = asyncio.run(go(url, starter.start))
        # the guard can see the server answer before start() has returned from its own check
        starter.join(timeout=60)
        assert ok and guard.down is None and box == [url]
        assert any("is back" in s for s in caplog.messages)
    finally:
        server.stop()


def test_batches_over_the_error_rate_are_skipped_then_the_run_stops(caplog):
    from verltool_jax.train.health import HealthMonitor

    def batch(n_failed: int, n: int = 4) -> list[Trajectory]:
        return [
            Trajectory(
                trajectory_id=f"t{i}",
                group_id="g",
                prompt_ids=[1],
                termination="error" if i < n_failed else "eos",
                error="ToolServerError: boom" if i < n_failed else None,
            )
            for i in range(n)
        ]

    caplog.set_level(logging.INFO, logger="verltool_jax")

    class Alive:
        alive = True

    async def go(url):
        guard = ToolServerGuard(url, None, down_grace_s=0)
        mon = HealthMonitor(guard, lambda: Alive(), None, max_error_rate=0.25, max_skipped_steps=2)
        assert await mon.admit(batch(1), 0)  # 1/4 = the threshold: trained on
        assert not await mon.admit(batch(2), 1)  # 2/4: skipped
        assert not await mon.admit(batch(4), 1)
        assert await mon.admit(batch(0), 1) and mon.skipped_in_a_row == 0
        for _ in range(2):
            assert not await mon.admit(batch(3), 2)
        with pytest.raises(
            DependencyDown,
            match=r"3 batches in a row failed .*3/4 "
            r"trajectories failed \(3x ToolServerError",
        ):
            await mon.admit(batch(3), 2)
        return mon

    with run_server(["python_code"], timeout=5) as url:
        mon = asyncio.run(go(url))
    assert mon.metrics()["health/skipped_steps"] == 5
    assert caplog.messages[0].startswith(
        "[health] step 2: 2/4 trajectories failed (2x ToolServerError: "
        "boom), more than trainer.max_error_rate=0.25: not training"
    )


def test_a_replica_list_is_healthy_while_any_replica_answers():
    """``tool_server.url`` may list replicas; the guard probed the whole comma-separated
    string as one URL and stopped every multi-replica run (launch/local_cluster.sh)."""
    from verltool_jax.samplers.remote_vllm import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    with run_server(["python_code"], timeout=5) as live:
        both = asyncio.run(ToolServerGuard(f"{dead},{live}", None, down_grace_s=0).healthy())
        assert both is True
    assert asyncio.run(ToolServerGuard(f"{dead},{live}", None, down_grace_s=0).healthy()) is False


def test_sigterm_during_the_sft_warm_start_stops_it_and_keeps_nothing(tmp_path, monkeypatch, capfd):
    """A signal during SFT ends it after the step in progress (not after all of them); no
    checkpoint is written (a resumed run would otherwise skip the unfinished warm start),
    the summary says interrupted, and the same command runs SFT again from the start."""
    import verltool_jax.train.sft as sft_mod
    from verltool_jax.train.__main__ import EXIT_INTERRUPTED, main

    out = tmp_path / "run"
    orig = sft_mod.sft_batch
    calls = []

    def sft_batch(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # during the third step
        return orig(*a, **kw)

    monkeypatch.setattr(sft_mod, "sft_batch", sft_batch)
    argv = _argv(out, "trainer.steps=2", "sft.steps=50", "sft.batch_size=2")
    assert main(argv) == EXIT_INTERRUPTED
    console = capfd.readouterr().out
    assert "[sft] stopped before step 4/50" in console and len(calls) == 3
    assert "interrupted during the SFT warm start" in console
    assert _ckpt_steps(out) == [] and not (out / "hf_model").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["sft_interrupted"] is True
    monkeypatch.setattr(sft_mod, "sft_batch", orig)
    assert main(_argv(out, "trainer.steps=1", "sft.steps=2", "sft.batch_size=2")) == 0
    console = capfd.readouterr().out
    assert "[sft] step 2/2" in console and "resumed" not in console
    assert _ckpt_steps(out) == [1]
