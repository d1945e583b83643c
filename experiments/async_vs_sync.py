"""Asynchronous vs batch-synchronous rollout (the rollout-mode ablation).

Same prompts, same real vLLM CPU sampler with a tiny model, a real tool server, three
tool-latency profiles:

* ``python``: the sandboxed ``python_code`` tool as it is (the server serves only it);
* ``search``: ``sleep_search``, latency lognormal with mean ``--search-mean-s`` (1 s) and
  log-sd ``--search-sigma`` (1.0), seeded per (trajectory, call) (served alone);
* ``mix``: half of the prompts ask for python, half for search (both served).

Each prompt ends with the tool to use ("... Use python."), and the warmed tiny model
follows it (93-99% of the calls in each python or search run use that tag); each profile's
server serves only its tools, so a stray tag is an invalid action (a fast error
observation), as it would be in a task that offers one tool. Each run prints its calls
per tool.

For each profile, ``--repeats`` times (new trajectory ids, hence new latency draws),
the script runs the batch-synchronous baseline (``rollout.sync_baseline``) and the
asynchronous loop (``rollout.agent_loop``) on the same prompts and prints sync wall time,
async wall time, speedup, and a lower bound on the async time:

    bound = max( max_i serial_i ,  G / peak_tps )
    serial_i = sum of trajectory i's tool latencies *alone* + sum over its turns of
               (a + b * tokens of the turn)      # its own time if it ran alone
    G = all tokens generated in the async run; peak_tps = the sampler's peak
        throughput, measured right before the async run (all requests at once)

where ``a + b*n`` is the single-request generation time fitted on this sampler right
before the async run (fastest of 5 requests per length). A tool latency *alone* is the
latency ``sleep_search`` drew for that call (reported by the server; no HTTP round trip,
no queueing), and for any other call (``python_code``) the smaller of its measured
latency and the fastest of 5 single python calls measured right before the run -- so
neither the batch's contention at the tool server nor at the sampler inflates the
bound. Prefill work is left out, so the bound is optimistic (lower) throughout.

The script also prints a *shared-CPU bound*, ``max(max_i serial_i, G / peak_tps +
P / peak_python)`` with ``P`` the python calls of the async run and ``peak_python`` the
python tool's peak calls/s (all calls at once, sampler idle): on this machine the
sandboxed python tool and the sampler share the same CPU cores, so their work adds up.
It is an estimate (either peak may leave some CPU unused), shown next to the issue's
bound, not instead of it. It also prints the sampler's decode step time alone and with
every trajectory in flight: the issue's bound takes the slowest trajectory's turns at
single-request speed *and* the batch at peak throughput, which a sampler can give at once
only if its step time barely depends on the batch size (a GPU); on a CPU it grows about
linearly with the batch (see the ``decode step`` line).

Workload size: 64 prompts x 4 samples = 256 trajectories per run by default (``--prompts``,
``--n-samples``), small next to a real RL step (VerlTool's recipes roll out 512-1024
trajectories per step), and the speedup over the synchronous baseline grows with the
batch: the synchronous schedule pays every turn's slowest tool call, the asynchronous
one only the slowest trajectory's own calls. The vLLM engine core runs in its own
process (see below); the engine admits up to 256 running sequences
(``VLLMSampler``'s default ``max_num_seqs``).

How a random tiny model produces actions: before the runs, the script warms the tiny
model for 300 steps (PyTorch, on CPU; about 30 s; cached in --workdir) on synthetic agent
transcripts in the experiment's format (a question ending with the tool to use, then
1-4 actions with that tool's tag, each followed by a
``<result>`` observation, then ``<answer>..</answer>`` and EOS; the number of actions is
random per transcript). Sampling at temperature 1 then ends each turn on an action stop
string or EOS by itself, and the number of tool calls varies across trajectories as it
does with a real policy. Nothing is forced: a turn cut by ``max_action_tokens`` without
an action ends its trajectory ("budget"), and the table reports the turn statistics.

Sampling is unseeded (vLLM CPU 0.32 crashes on per-request seeds when a seeded request's
prefill is chunked: "CPU Generator does not use offset"), so the sync and async runs
draw different but identically distributed actions; the search latencies are seeded per
(trajectory id, call index) and are the same in both runs.

Partial rollouts against bounded staleness alone (``--partial-profiles``, after the table
above; ``--profiles ""`` runs only these): the asynchronous producer and queue as the trainer
drives them (``RolloutProducer`` + ``TrajectoryQueue`` with ``--max-staleness`` and
``--batch-groups`` groups a step), and a stand-in trainer that takes a batch, "trains" for
``--train-s`` seconds (a sleep: the train step runs elsewhere) and pushes real weights to
the engine as the next version (the checkpoint's tensors through the same shared-memory
sync as a run). Per mode, ``--steps`` steps: median step time (batch to batch), tokens/s
(sampled tokens of the trained batches / wall), groups dropped as too stale, the groups'
mean staleness (oldest token) and the turns a sync cut. Modes alternate within one run:
``drained`` (the conventional baseline: a sync waits for the requests in flight to finish
on the old weights, ``VLLMSampler.drain_at_sync``), ``bounded`` (``rollout.partial_rollouts``
off, this project's default: a request in flight at a sync goes on with the new weights
and keeps the version it started on) and ``partial`` (on). Profiles: ``search`` (as above) and
``heavytail``, one turn of exactly L tokens per trajectory, L Pareto-distributed
(``--heavy-alpha``, from ``--heavy-min`` tokens, capped at ``--heavy-max``) and seeded by
the trajectory id (vLLM ``min_tokens = max_tokens``: EOS and stop strings wait until then).

Run:  python experiments/async_vs_sync.py   (about 10 minutes on 2 CPU cores; --repeats 1
      --prompts 16 for a 1-minute look)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The engine core in its own process: in-process (=0) it competes for the GIL with the
# rollout's event loop, which then answers each trajectory late (measured: the last
# trajectory's generation took 11-18 s in-process vs 0.6-0.9 s with its own process).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = (
    "the a of city country year river capital population founded largest name who what "
    "which where when first president author book film river mountain"
).split()
SYSTEM = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
# The tool server of each profile serves what its task would (python: the math task's
# sandboxed python; search: the heavy-tailed stand-in; mix: both).
PROFILE_TOOLS = {
    "python": ["python_code"],
    "search": ["sleep_search"],
    "mix": ["sleep_search", "python_code"],
}


def agent_rollout_config(args: argparse.Namespace):
    """The multi-turn agent's rollout settings (python and search tools, unseeded turns)."""
    from verltool_jax.rollout.config import RolloutConfig

    return RolloutConfig(
        max_turns=args.max_turns,
        max_response_tokens=512,
        max_action_tokens=args.max_action_tokens,
        max_obs_tokens=64,
        action_stop_strings=("</python>", "</search>"),
        temperature=1.0,
        obs_template="<result>{obs}</result>",
    )


def start_tool_server(args: argparse.Namespace, tools: list[str]):
    """The experiment's tool server (``run_server``): ``tools``, with the simulated search's
    latency settings from the command line; a context manager giving its URL."""
    from tool_server.launcher import run_server

    return run_server(
        tools=list(tools),
        timeout=30.0,
        max_concurrency=1024,
        tool_max_concurrency=1024,
        tool_opt={
            "sleep_search_mean_s": args.search_mean_s,
            "sleep_search_sigma": args.search_sigma,
            "sleep_search_seed": args.seed,
        },
    )


def question(rng: random.Random, tool: str) -> str:
    """A question that ends with the tool to use (the last words before the answer turn,
    so the tiny model learns to follow the request; see ``warm_tiny_model``)."""
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 8)))
    return f"{words.capitalize()}? Use {tool}."


def transcript(rng: random.Random, tool: str) -> str:
    """One synthetic agent episode: k in 1..4 actions with observations, then an answer."""
    text = SYSTEM.format(q=question(rng, tool))
    for _ in range(rng.randint(1, 4)):
        if tool == "search":
            q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
            text += f"<search>{q}</search><result>Doc 1: results for '{q}'.</result>"
        else:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            text += f"<python>print({a} * {b})</python><result>{a * b}\n</result>"
    return text + f"<answer>{rng.randint(1, 999)}</answer><|im_end|>"


def warm_tiny_model(out: Path, steps: int, seed: int) -> Path:
    """Build the tiny qwen2 checkpoint and fit it briefly to the transcript format."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verltool_jax.models.tiny import build_tiny_hf

    marker = out / f"warmed_v2_{steps}_{seed}"
    if marker.exists():  # reuse a model warmed by an earlier run
        print(f"  reusing the warmed model in {out}", flush=True)
        return out
    build_tiny_hf(out, "qwen2", seed=seed)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        texts = [transcript(rng, rng.choice(["search", "python"])) for _ in range(16)]
        enc = [tok.encode(t, add_special_tokens=False) for t in texts]
        n = max(map(len, enc))
        ids = torch.full((len(enc), n), tok.pad_token_id)
        mask = torch.zeros((len(enc), n), dtype=torch.long)
        for i, e in enumerate(enc):
            ids[i, : len(e)] = torch.tensor(e)
            mask[i, : len(e)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  warm-up step {step}: loss {loss.item():.3f}", flush=True)
    model.save_pretrained(out, safe_serialization=True)
    print(f"  warm-up: {steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    marker.touch()
    return out


# ------------------------------------------------------------------ sampler measurements
async def measure_sampler(sampler, prompt_ids: list[int], n_concurrent: int, n_tokens: int):
    """Peak throughput (tokens generated / wall time with ``n_concurrent`` requests
    submitted at once, best of 2) and the single-request time model ``t(n) = a + b*n``."""
    from verltool_jax.samplers.base import SamplingParams

    async def one(n, i):
        p = SamplingParams(max_tokens=n, temperature=1.0)
        t0 = time.perf_counter()
        c = await sampler.generate(prompt_ids, p, request_id=f"probe{i}-{n}")
        return time.perf_counter() - t0, len(c.token_ids)

    await one(4, 0)  # warm the engine
    # Fastest of several single requests per length: on a shared machine the minimum is
    # the best estimate of the uncontended cost, which keeps the bound a lower bound.
    fastest = {}
    for n in (4, n_tokens):
        runs = [await one(n, k) for k in range(5)]
        fastest[n] = min(runs, key=lambda r: r[0] / max(r[1], 1))
    (t1, n1), (t2, n2) = fastest[4], fastest[n_tokens]
    b = (t2 - t1) / (n2 - n1) if n2 != n1 else t2 / max(n2, 1)
    a = t1 - b * n1
    best = 0.0
    for rep in range(2):
        t0 = time.perf_counter()
        res = await asyncio.gather(
            *(one(n_tokens, 100 + rep * n_concurrent + i) for i in range(n_concurrent))
        )
        best = max(best, sum(r[1] for r in res) / (time.perf_counter() - t0))
    return best, max(a, 0.0), max(b, 0.0)


def alone_tool_latencies(t, python_alone_s: float) -> list[float]:
    """Trajectory ``t``'s tool latencies as they would be if it ran alone.

    A ``sleep_search`` call reports the latency it drew (``metrics.latency_s``, a pure
    function of the call's identity): that draw is used, without the HTTP round trip or
    any queueing. Any other call (``python_code``, an invalid action) counts as
    ``min(measured, python_alone_s)``, the fastest python call measured alone right
    before the run -- so the contention of the batch never inflates the bound.
    """
    drawn = {}
    for e in t.extras:
        lat = (e.get("metrics") or {}).get("latency_s") if isinstance(e, dict) else None
        if isinstance(lat, (int, float)):
            drawn[e["turn"]] = float(lat)
    # call j follows the model turn j+1 (every tool call ends exactly one model turn)
    return [drawn.get(j + 1, min(m, python_alone_s)) for j, m in enumerate(t.tool_latencies)]


def lower_bound(
    trajs, peak_tps: float, a: float, b: float, python_alone_s: float
) -> tuple[float, float, float]:
    """``(bound, slowest serial time, total generation work / peak throughput)``."""
    serial = max(
        sum(alone_tool_latencies(t, python_alone_s)) + sum(a + b * n for n in t.gen_tokens)
        for t in trajs
    )
    work = sum(sum(t.gen_tokens) for t in trajs) / peak_tps
    return max(serial, work), serial, work


async def measure_python_alone(url: str, n: int = 5) -> float:
    """Fastest of ``n`` single ``python_code`` calls (the uncontended tool latency)."""
    from tool_server.client import ToolClient

    best = float("inf")
    async with ToolClient(url, timeout_s=60.0) as client:
        for i in range(n):
            t0 = time.perf_counter()
            await client.get_observation(f"probe-py{i}", "<python>print(12 * 34)</python>")
            best = min(best, time.perf_counter() - t0)
        await client.finish([f"probe-py{i}" for i in range(n)])
    return best


def calls_per_tool(trajs) -> dict[str, int]:
    """How many calls went to each tool tag (the model writes the tag; the prompt asks)."""
    n = {"search": 0, "python": 0, "other": 0}
    for t in trajs:
        for act in t.actions:
            n["search" if "</search>" in act else "python" if "</python>" in act else "other"] += 1
    return n


def tool_mix(trajs) -> str:
    return ", ".join(f"{k} {v}" for k, v in calls_per_tool(trajs).items() if v)


def cpu_seconds(engine_pids: list[int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far, by group: ``sampler`` (the vLLM engine
    processes and their descendants), ``tools`` (every other child process tree: the tool
    server, its sandboxes, the fork servers and the calls they reaped) and ``rollout``
    (this process: the rollout loop, the tool client and vLLM's front end)."""
    import psutil

    def tree(p: psutil.Process) -> float:
        total = 0.0
        for q in [p] + p.children(recursive=True):
            try:
                c = q.cpu_times()
                total += c.user + c.system + c.children_user + c.children_system
            except psutil.Error:
                pass
        return total

    me = psutil.Process()
    own = me.cpu_times()
    out = {"sampler": 0.0, "tools": 0.0, "rollout": own.user + own.system}
    for child in me.children():
        try:
            out["sampler" if child.pid in engine_pids else "tools"] += tree(child)
        except psutil.Error:
            pass
    return out


def cpu_line(before: dict, after: dict, wall: float) -> str:
    d = {k: after[k] - before[k] for k in after}
    total = sum(d.values())
    cores = os.cpu_count() or 1
    return (
        f"CPU {total:.1f} s = {total / (wall * cores):.0%} of {cores} cores x wall "
        f"(sampler {d['sampler']:.1f} s, tool server {d['tools']:.1f} s, rollout + vLLM "
        f"front end {d['rollout']:.1f} s)"
    )


async def run_profile(mode: str, prompts, n_samples, sampler, url, tok, cfg):
    from tool_server.client import ToolClient
    from verltool_jax.rollout.agent_loop import run_rollout
    from verltool_jax.rollout.sync_baseline import run_rollout_sync

    fn = run_rollout if mode == "async" else run_rollout_sync
    async with ToolClient(url, timeout_s=60.0, max_connections=512) as client:
        t0 = time.perf_counter()
        groups = await fn(prompts, n_samples, sampler, client, tok, cfg)
        wall = time.perf_counter() - t0
    return wall, [t for g in groups for t in g]


async def measure_tool_peak(url: str, n: int) -> float:
    """The python tool's peak throughput (calls/s): ``n`` single calls submitted at once,
    sampler idle, best of 2."""
    from tool_server.client import ToolClient

    best = 0.0
    async with ToolClient(url, timeout_s=60.0, max_connections=512) as client:
        for rep in range(2):
            ids = [f"probe-peak{rep}-{i}" for i in range(n)]
            t0 = time.perf_counter()
            await asyncio.gather(
                *(client.get_observation(t, "<python>print(12 * 34)</python>") for t in ids)
            )
            best = max(best, n / (time.perf_counter() - t0))
            await client.finish(ids)
    return best


def python_calls(trajs) -> int:
    return calls_per_tool(trajs)["python"]


async def run_once(profile, rep, prompts, args, sampler, url, tok, cfg, n_traj, probe_prompt):
    """Sync then async on ``prompts``; print the details; return the table row."""
    engines = sampler.engine_pids()
    cpu0 = cpu_seconds(engines)
    sync_wall, sync_t = await run_profile("sync", prompts, args.n_samples, sampler, url, tok, cfg)
    sync_cpu = cpu_line(cpu0, cpu_seconds(engines), sync_wall)
    # measured right before the async run, under the same machine load
    peak, a, b = await measure_sampler(sampler, probe_prompt, n_traj, args.max_action_tokens)
    serves_python = "python_code" in PROFILE_TOOLS[profile]
    py_alone = await measure_python_alone(url) if serves_python else 0.0
    py_peak = await measure_tool_peak(url, n_traj) if serves_python else float("inf")
    cpu0 = cpu_seconds(engines)
    async_wall, async_t = await run_profile(
        "async", prompts, args.n_samples, sampler, url, tok, cfg
    )
    async_cpu = cpu_line(cpu0, cpu_seconds(engines), async_wall)
    bound, serial, gen_work = lower_bound(async_t, peak, a, b, py_alone)
    tool_work = python_calls(async_t) / py_peak
    shared = max(serial, gen_work + tool_work)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    last = max(async_t, key=lambda t: t.wall_time_s)
    py_text = (
        f", python call alone {py_alone * 1000:.1f} ms, python peak {py_peak:.0f} calls/s"
        if serves_python
        else ""
    )
    print(
        f"  {profile} #{rep} (load average {load}; tools {','.join(PROFILE_TOOLS[profile])}): "
        f"sampler peak {peak:.0f} tok/s, alone t(n) = {a * 1000:.1f} ms + {b * 1000:.2f} ms * n"
        f"{py_text}\n"
        f"    decode step: {b * 1000:.1f} ms alone, {n_traj / peak * 1000:.1f} ms with {n_traj} "
        f"sequences ({n_traj / peak / max(b, 1e-9):.1f}x)\n"
        f"    sync  {sync_wall:.1f} s: {describe(sync_t)}\n"
        f"          {sync_cpu}\n"
        f"    async {async_wall:.1f} s: {describe(async_t)}\n"
        f"          {async_cpu}\n"
        f"    bound {bound:.1f} s = max(slowest serial {serial:.1f} s, generation work "
        f"{gen_work:.1f} s); shared-CPU bound {shared:.1f} s = max(slowest serial, generation "
        f"work + python work {tool_work:.1f} s)\n"
        f"    last to finish: {last.wall_time_s:.1f} s = generation "
        f"{sum(last.gen_latencies):.1f} s (alone {sum(a + b * n for n in last.gen_tokens):.1f} s)"
        f" + tools {sum(last.tool_latencies):.1f} s (alone "
        f"{sum(alone_tool_latencies(last, py_alone)):.1f} s), {last.num_turns} turns",
        flush=True,
    )
    return profile, sync_wall, async_wall, bound, shared


# ------------------------------------------------------------------ partial rollouts
MODES = ("drained", "bounded", "partial")  # alternated in this order within a repeat


def pareto_tokens(seed: int, trajectory_id: str, alpha: float, lo: int, hi: int) -> int:
    """A heavy-tail generation length: ``min(hi, floor(lo * u ** (-1 / alpha)))``, ``u``
    uniform in (0, 1] seeded by ``(seed, trajectory_id)`` (Pareto with index ``alpha``)."""
    import hashlib

    h = hashlib.sha256(f"{seed}:{trajectory_id}".encode()).digest()
    u = 1.0 - random.Random(int.from_bytes(h[:8], "little")).random()
    return min(hi, int(lo * u ** (-1.0 / alpha)))


class HeavyTail:
    """The ``heavytail`` profile over a ``VLLMSampler``: each request generates exactly its
    trajectory's Pareto length (``pareto_tokens``; the rest of the budget unused)."""

    def __init__(self, sampler, alpha: float, lo: int, hi: int, seed: int) -> None:
        self.sampler, self.alpha, self.lo, self.hi, self.seed = sampler, alpha, lo, hi, seed

    @property
    def version(self) -> int:
        return self.sampler.version

    async def generate(self, ids, params, request_id=None, **kw):
        import dataclasses

        n = pareto_tokens(self.seed, str(request_id), self.alpha, self.lo, self.hi)
        p = dataclasses.replace(params, max_tokens=min(params.max_tokens, n))
        return await self.sampler.generate(ids, p, request_id, **kw)


def exact_lengths(sampler):
    """Make ``sampler`` (a ``VLLMSampler``) generate exactly ``max_tokens`` per request
    (vLLM ``min_tokens``); returns the undo. For the heavy-tail profile only."""
    orig = sampler._vllm_params

    def exact(params, max_new):
        v = orig(params, max_new)
        v.min_tokens = v.max_tokens
        return v

    sampler._vllm_params = exact
    return lambda: setattr(sampler, "_vllm_params", orig)


async def stepped_run(sampler, gen, url, tok, cfg, prompts, args, mode: str, named) -> dict:
    """One mode (``MODES``) of the partial-rollout comparison (see the module docstring)."""
    from tool_server.client import ToolClient
    from verltool_jax.rollout.producer import RolloutProducer
    from verltool_jax.rollout.queue import TrajectoryQueue

    sampler.partial_rollouts = mode == "partial"
    sampler.drain_at_sync = mode == "drained"
    base = sampler.version
    q = TrajectoryQueue(
        max_groups=64,
        max_staleness=args.max_staleness,
        groups_per_batch=args.batch_groups,
        start_version=base,
    )
    trained, steps, cuts, lags = 0, [], 0, []
    async with ToolClient(url, timeout_s=60.0, max_connections=512) as client:
        producer = RolloutProducer(
            iter(enumerate(prompts)),
            n_samples=args.n_samples,
            sampler=gen,
            tool_client=client,
            tokenizer=tok,
            cfg=cfg,
            queue=q,
        )
        task = q.watch(asyncio.create_task(producer.run()))
        t0 = last = time.perf_counter()
        try:
            for step in range(args.steps):
                batch = await q.get_batch(args.batch_groups, timeout=600)
                producer.consumed(batch)
                trajs = [t for g in batch for t in g]
                trained += sum(sum(t.loss_mask) for t in trajs)
                cuts += sum(len(set(t.versions) - {-1}) - 1 for t in trajs)
                lags += [q.version - t.min_version for t in trajs if t.min_version >= 0]
                await asyncio.sleep(args.train_s)  # the train step
                await asyncio.to_thread(sampler.load_named_tensors, named, base + step + 1)
                await q.set_version(base + step + 1)
                now = time.perf_counter()
                steps.append(now - last)
                last = now
            wall = time.perf_counter() - t0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return {
        "step_s": statistics.median(steps),
        "tokens_per_s": trained / wall,
        "dropped": q.metrics.dropped_stale,
        "staleness": statistics.mean(lags) if lags else 0.0,
        "cuts": cuts,
        "wall": wall,
    }


def partial_rows(sampler, model_dir, tok, args, say) -> list[tuple]:
    """Bounded staleness alone vs partial rollouts, per ``--partial-profiles`` profile,
    ``--partial-repeats`` alternations; returns ``(profile, mode, rep, result)`` rows."""
    from verltool_jax.models.safetensors_io import checkpoint_files, iter_tensors
    from verltool_jax.rollout.agent_loop import as_prompt_item
    from verltool_jax.rollout.config import RolloutConfig

    named = [nt for f in checkpoint_files(model_dir) for nt in iter_tensors(f)]
    rng = random.Random(args.seed + 2)
    rows = []
    for profile in [p for p in args.partial_profiles.split(",") if p]:
        if profile == "heavytail":
            cfg = RolloutConfig(
                max_turns=1,
                max_response_tokens=args.heavy_max,
                action_stop_strings=("</search>",),
                temperature=1.0,
                obs_template="<result>{obs}</result>",
            )
            gen = HeavyTail(sampler, args.heavy_alpha, args.heavy_min, args.heavy_max, args.seed)
        elif profile == "search":
            cfg = agent_rollout_config(args)
            gen = sampler
        else:
            raise SystemExit(f"--partial-profiles: unknown profile {profile!r} (search, heavytail)")
        undo = exact_lengths(sampler) if profile == "heavytail" else (lambda: None)
        n_prompts = args.steps * args.batch_groups * 4  # enough for the steps and the drops
        try:
            with start_tool_server(args, ["sleep_search"]) as url:
                for rep in range(args.partial_repeats):
                    for mode in MODES:
                        prompts = [
                            {
                                "prompt_ids": tok.encode(
                                    SYSTEM.format(q=question(rng, "search")),
                                    add_special_tokens=False,
                                ),
                                "group_id": f"{profile}-{mode}{rep}_{i}",
                            }
                            for i in range(n_prompts)
                        ]
                        items = [as_prompt_item(p, i) for i, p in enumerate(prompts)]
                        r = asyncio.run(
                            stepped_run(sampler, gen, url, tok, cfg, items, args, mode, named)
                        )
                        say(
                            f"  {profile} {mode} #{rep}: step {r['step_s']:.2f} s, "
                            f"{r['tokens_per_s']:.0f} tokens/s, dropped {r['dropped']}, "
                            f"staleness {r['staleness']:.2f}, version changes in trajectories {r['cuts']}, wall {r['wall']:.1f} s",
                            flush=True,
                        )
                        rows.append((profile, mode, rep, r))
        finally:
            undo()
            sampler.partial_rollouts = sampler.drain_at_sync = False
    return rows


def print_partial_table(rows, args, say) -> None:
    say()
    say(
        f"partial rollouts vs bounded staleness alone: {args.batch_groups} groups x "
        f"{args.n_samples} samples a step, max_staleness {args.max_staleness}, "
        f"train step {args.train_s} s, {args.steps} steps a run"
    )
    say(
        "| profile | mode | runs | step time (s) | tokens/s | dropped groups | "
        "staleness (oldest token) | tokens/s vs drained | tokens/s vs bounded |"
    )
    say("|---|---|---|---|---|---|---|---|---|")
    med = statistics.median
    for profile in dict.fromkeys(r[0] for r in rows):
        by = {m: [r[3] for r in rows if r[0] == profile and r[1] == m] for m in MODES}
        drained = med(x["tokens_per_s"] for x in by["drained"])
        base = med(x["tokens_per_s"] for x in by["bounded"])
        for mode, rs in by.items():
            tps = med(x["tokens_per_s"] for x in rs)
            say(
                f"| {profile} | {mode} | {len(rs)} | {med(x['step_s'] for x in rs):.2f} | "
                f"{tps:.0f} | {med(x['dropped'] for x in rs):.0f} | "
                f"{med(x['staleness'] for x in rs):.2f} | {tps / drained:.2f}x | "
                f"{tps / base:.2f}x |"
            )


def describe(trajs) -> str:
    calls = [t.tool_calls for t in trajs]
    term = {}
    for t in trajs:
        term[t.termination] = term.get(t.termination, 0) + 1
    return (
        f"tool calls/traj mean {statistics.mean(calls):.2f} (min {min(calls)}, max "
        f"{max(calls)}; {tool_mix(trajs)}), terminations {dict(sorted(term.items()))}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n-samples", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-action-tokens", type=int, default=32)
    ap.add_argument("--search-mean-s", type=float, default=1.0)
    ap.add_argument("--search-sigma", type=float, default=1.0)
    ap.add_argument("--warm-steps", type=int, default=300)
    ap.add_argument("--profiles", default="python,search,mix")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs per profile (new trajectory ids, so new latency draws)",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the model warm-up, the prompts and the search latencies",
    )
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--partial-profiles", default="search,heavytail")
    ap.add_argument("--partial-repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="trainer steps per partial run")
    ap.add_argument("--batch-groups", type=int, default=4)
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--train-s", type=float, default=1.0)
    ap.add_argument("--heavy-alpha", type=float, default=1.1)
    ap.add_argument("--heavy-min", type=int, default=16)
    ap.add_argument("--heavy-max", type=int, default=768)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from verltool_jax.runtime.console import library_output_to
    from verltool_jax.samplers.vllm_sampler import VLLMSampler

    work = Path(args.workdir or tempfile.mkdtemp(prefix="async_vs_sync_"))
    # vLLM's and the tool server's lines go to the log; the progress and the table to
    # the console
    with library_output_to(work / "run.log") as term:

        def say(*parts, **_) -> None:  # to the console (stdout is the log here)
            print(*parts, file=term, flush=True)

        say(f"library logs (vLLM, XLA, tool server) go to {work / 'run.log'}", flush=True)
        say(f"[1/3] warming the tiny model in {work}", flush=True)
        model_dir = warm_tiny_model(work / "model", args.warm_steps, args.seed)
        tok = AutoTokenizer.from_pretrained(model_dir)
        cfg = agent_rollout_config(args)
        rng = random.Random(args.seed + 1)
        n_traj = args.prompts * args.n_samples

        def prompts_for(profile: str, rep: int = 0):
            tools = {
                "python": ["python"] * args.prompts,
                "search": ["search"] * args.prompts,
                "mix": ["python", "search"] * (args.prompts // 2) + ["search"] * (args.prompts % 2),
            }[profile]
            return [
                {
                    "prompt_ids": tok.encode(
                        SYSTEM.format(q=question(rng, t)), add_special_tokens=False
                    ),
                    "group_id": f"{profile}{rep}_{i}",
                }
                for i, t in enumerate(tools)
            ]

        say("[2/3] starting the vLLM CPU sampler", flush=True)
        sampler = VLLMSampler(model_dir, max_model_len=1024, seed=args.seed)
        rows = []
        partial = []
        try:
            profiles = [p for p in args.profiles.split(",") if p]
            probe_prompt = prompts_for("search")[0]["prompt_ids"]
            say(
                f"[3/3] {args.prompts} prompts x {args.n_samples} samples = {n_traj} "
                f"trajectories per run",
                flush=True,
            )
            for profile in profiles:
                # Each profile gets the server its task would have: an action for a tool that
                # is not served is an invalid action (a fast error observation).
                with start_tool_server(args, PROFILE_TOOLS[profile]) as url:
                    for rep in range(args.repeats):
                        rows.append(
                            asyncio.run(
                                run_once(
                                    profile,
                                    rep,
                                    prompts_for(profile, rep),
                                    args,
                                    sampler,
                                    url,
                                    tok,
                                    cfg,
                                    n_traj,
                                    probe_prompt,
                                )
                            )
                        )
            if args.partial_profiles:
                say("[partial] partial rollouts vs bounded staleness alone", flush=True)
                partial = partial_rows(sampler, model_dir, tok, args, say)
        finally:
            sampler.close()

        if partial:
            print_partial_table(partial, args, say)
        if not profiles:
            return
        say()
        say(
            f"{n_traj} trajectories per run; load average (1, 5, 15 min) at the end: "
            + " ".join(f"{x:.1f}" for x in os.getloadavg())
            + f" on {os.cpu_count()} CPUs"
        )
        say(
            "| profile | run | sync wall (s) | async wall (s) | speedup | async lower bound (s) "
            "| async / bound | shared-CPU bound (s) | async / shared-CPU bound |"
        )
        say("|---|---|---|---|---|---|---|---|---|")
        med = statistics.median
        for p in profiles:
            mine = [r for r in rows if r[0] == p]
            for k, (_, s_, a_, lb, sb) in enumerate(mine):
                say(
                    f"| {p} | {k} | {s_:.1f} | {a_:.1f} | {s_ / a_:.2f}x | {lb:.1f} | "
                    f"{a_ / lb:.2f} | {sb:.1f} | {a_ / sb:.2f} |"
                )
            say(
                f"| {p} | median | {med(r[1] for r in mine):.1f} | {med(r[2] for r in mine):.1f} "
                f"| {med(r[1] / r[2] for r in mine):.2f}x | {med(r[3] for r in mine):.1f} | "
                f"{med(r[2] / r[3] for r in mine):.2f} | {med(r[4] for r in mine):.1f} | "
                f"{med(r[2] / r[4] for r in mine):.2f} |"
            )


if __name__ == "__main__":
    main()
