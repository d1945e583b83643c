"""The GPU figures in one process: bf16 matmul ceiling, train-step MFU, JAX sampler tokens/s,
weight-publish seconds.

    python benchmarks/gpu_check.py [--out DIR] [--quick]

Runs on whatever JAX's default backend is (the device tool's GPU machine; ``--quick`` shrinks
every size for a smoke run on CPU). Random weights throughout: MFU and throughput depend on
the shapes, not the values, and the device machine cannot hold the SmolLM2 GGUF (98 MB, over
its transfer limit) or reach a registry. Parts, each printed as it finishes and appended to
``DIR/gpu_check.json``:

1. **Ceiling**: an 8192^3 bf16 matmul in JAX, TFLOP/s (mean of 10 after 3 warm-ups).
2. **Train step MFU** of one GRPO update (``train.step.make_train_step``, token-mean, AdamW,
   fp32 master weights, bf16 compute, micro-batched gradient accumulation) at the SmolLM2-135M shape and at a Qwen2.5-1.5B shape.
   FLOPs per step = 6 * (matmul params, LM head included) * tokens + 12 * layers * B * T^2 *
   heads * head_dim (attention scores and weighted values over the full T x T, no causal
   discount; the PaLM appendix-B count), tokens = B * T (every position runs forward and
   backward). MFU = FLOPs / step seconds / 989e12 (the H100/H200 SXM dense bf16 datasheet
   peak; the measured ceiling of part 1 is printed beside it).
3. **JAX sampler tokens/s** (``samplers.jax_sampler.JAXSampler``, bf16, SmolLM2 shape): P
   prompts of 64 random ids x N new tokens, T=1, no EOS (so every request runs to N);
   generated tokens / wall seconds after a warm-up round that compiles.
4. **Weight publish**: the trainer's fp32 params cast to bf16 on device and swapped into the
   JAX sampler (what a colocated sync costs), and the same bf16 params gathered to host in
   HF layout (``models.hf_io.hf_named_tensors``: what a remote vLLM server would be sent),
   seconds and GB/s, at both shapes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_BF16 = 989e12  # H100/H200 SXM dense bf16, datasheet

SHAPES = {
    # SmolLM2-135M-Instruct's config.json (llama)
    "smollm2-135m": dict(
        model_type="llama",
        vocab_size=49152,
        hidden_size=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        intermediate_size=1536,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
    ),
    # Qwen2.5-1.5B's config.json (qwen2, q/k/v biases)
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=1536,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        intermediate_size=8960,
        tie_word_embeddings=True,
        qkv_bias=True,
        rope_theta=1000000.0,
    ),
}
QUICK = dict(
    vocab_size=512,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
)


def log(out: Path, key: str, value) -> None:
    path = out / "gpu_check.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1))
    print(f"== {key}: {json.dumps(value)}", flush=True)


def matmul_params(c) -> int:
    """Parameters that take part in matmuls: attention and MLP projections plus the LM head."""
    per_layer = (
        c.hidden_size * c.head_dim * (c.num_heads + 2 * c.num_kv_heads)
        + c.num_heads * c.head_dim * c.hidden_size
        + 3 * c.hidden_size * c.intermediate_size
    )
    return c.num_layers * per_layer + c.hidden_size * c.vocab_size


def step_flops(c, B: int, T: int) -> float:
    """6 N (B T) + 12 L B T^2 H d: forward + backward, the full T x T attention."""
    return (
        6.0 * matmul_params(c) * B * T + 12.0 * c.num_layers * B * T * T * c.num_heads * c.head_dim
    )


def ceiling(out: Path, quick: bool) -> float:
    import jax
    import jax.numpy as jnp

    n = 512 if quick else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    f = jax.jit(lambda x, y: x @ y)
    for _ in range(3):
        f(a, b).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(10):
        r = f(a, b)
    r.block_until_ready()
    tflops = 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12
    log(out, "matmul_bf16_tflops", round(tflops, 1))
    return tflops


def make_batch(B: int, T: int, vocab: int):
    import numpy as np

    rng = np.random.default_rng(0)
    lm = np.ones((B, T), np.float32)
    lm[:, : T // 4] = 0.0
    lp = np.where(lm > 0, -rng.uniform(0.5, 4.0, (B, T)), 0.0).astype(np.float32)
    return dict(
        input_ids=rng.integers(1, vocab, (B, T)).astype(np.int32),
        attention_mask=np.ones((B, T), np.int32),
        loss_mask=lm,
        advantages=rng.normal(size=B).astype(np.float32),
        old_logprobs=lp,
        sampler_logprobs=lp.copy(),
    )


def model_config(name: str, quick: bool, **kw):
    from verltool_jax.models.config import ModelConfig

    d = dict(SHAPES[name])
    if quick:
        d.update(QUICK)
    d.update(kw)
    return ModelConfig(**d)


def train_mfu(
    out: Path, name: str, B: int, T: int, micro: int, steps: int, quick: bool, ceil: float
):
    import jax
    import numpy as np
    from flax import nnx

    from verltool_jax.algos.config import algo_config
    from verltool_jax.algos.optimizer import make_optimizer
    from verltool_jax.models.transformer import Transformer
    from verltool_jax.train.state import TrainState
    from verltool_jax.train.step import make_train_step

    cfg = model_config(name, quick, dtype="bfloat16", param_dtype="float32")
    opt = make_optimizer(dict(lr=1e-6))
    state = TrainState.create(Transformer(cfg, nnx.Rngs(0)), opt)
    step = make_train_step(
        algo_config(mini_batch_size=B, micro_batch_size=micro), state.graphdef, opt
    )
    batch = make_batch(B, T, cfg.vocab_size)
    t0 = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
    s = float(np.median(times))
    fl = step_flops(cfg, B, T)
    res = dict(
        B=B,
        T=T,
        micro_batch=micro,
        matmul_params=matmul_params(cfg),
        step_s=round(s, 4),
        first_step_s=round(compile_s, 1),
        tokens_per_s=round(B * T / s),
        tflops=round(fl / s / 1e12, 1),
        mfu_vs_datasheet=round(fl / s / PEAK_BF16, 3),
        mfu_vs_measured_matmul=round(fl / s / (ceil * 1e12), 3),
        loss=float(m["loss"]),
    )
    log(out, f"train_step[{name}]", res)
    return state, cfg


def sampler_tps(out: Path, name: str, prompts: int, new_tokens: int, quick: bool):
    import numpy as np
    from flax import nnx

    from verltool_jax.models.transformer import Transformer
    from verltool_jax.samplers import SamplingParams
    from verltool_jax.samplers.jax_sampler import JAXSampler

    cfg = model_config(name, quick, dtype="bfloat16", param_dtype="bfloat16")
    smp = JAXSampler(
        Transformer(cfg, nnx.Rngs(0)),
        eos_token_ids=[],
        max_model_len=64 + new_tokens + 16,
        max_batch_size=prompts,
    )
    rng = np.random.default_rng(0)
    reqs = [rng.integers(20, cfg.vocab_size, 64).tolist() for _ in range(prompts)]

    async def run(p):
        return await asyncio.gather(
            *[smp.generate(r, p, request_id=f"r{i}") for i, r in enumerate(reqs)]
        )

    t0 = time.perf_counter()
    asyncio.run(run(SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=0)))
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    comps = asyncio.run(run(SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=1)))
    dt = time.perf_counter() - t0
    n = sum(len(c.token_ids) for c in comps)
    log(
        out,
        f"jax_sampler[{name}] {prompts}x{new_tokens}",
        dict(
            tokens=n,
            seconds=round(dt, 2),
            tokens_per_s=round(n / dt),
            warmup_round_s=round(warm, 1),
        ),
    )
    return smp


def publish(out: Path, name: str, state, cfg, smp) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from verltool_jax.models.hf_io import hf_named_tensors

    params = state.sampler_params() if hasattr(state, "sampler_params") else state.params
    cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(jnp.bfloat16), p))
    jax.block_until_ready(cast(params))  # compile
    t0 = time.perf_counter()
    bf = jax.block_until_ready(cast(params))
    if smp is not None:
        smp.update_weights(bf, 1)
    colocated = time.perf_counter() - t0
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(bf))
    gathered, t0 = 0, time.perf_counter()
    for _, arr in hf_named_tensors(nnx.State(bf) if not isinstance(bf, nnx.State) else bf, cfg):
        gathered += np.asarray(arr).nbytes
    host = time.perf_counter() - t0
    log(
        out,
        f"weight_publish[{name}]",
        dict(
            bf16_bytes=nbytes,
            colocated_cast_and_swap_s=round(colocated, 4),
            to_host_hf_layout_s=round(host, 3),
            to_host_gb_s=round(gathered / host / 1e9, 2),
        ),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/gpu_check"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke run")
    ap.add_argument(
        "--parts",
        default="ceiling,smol,big,sampler",
        help="comma list of ceiling, smol, big, sampler",
    )
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import jax

    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout
    except OSError:
        smi = "no nvidia-smi"
    import flax

    log(
        out,
        "machine",
        dict(
            gpu=smi.strip(),
            devices=[str(d) for d in jax.devices()],
            jax=jax.__version__,
            flax=flax.__version__,
            python=platform.python_version(),
            cpus=os.cpu_count(),
        ),
    )
    parts = set(a.parts.split(","))
    q = a.quick
    ceil = PEAK_BF16 / 1e12
    jobs = []
    if "ceiling" in parts:
        jobs.append(("ceiling", lambda: ceiling(out, q)))
    state = {}
    if "smol" in parts:
        jobs.append(
            (
                "train smol",
                lambda: state.update(
                    smol=train_mfu(
                        out,
                        "smollm2-135m",
                        4 if q else 64,
                        64 if q else 1024,
                        2 if q else 16,
                        3 if q else 5,
                        q,
                        state.get("ceil", ceil),
                    )
                ),
            )
        )
    if "sampler" in parts:
        for P in (4,) if q else (64, 256):
            jobs.append(
                (
                    f"sampler {P}",
                    lambda P=P: state.update(
                        smp=sampler_tps(out, "smollm2-135m", P, 16 if q else 256, q)
                    ),
                )
            )
        jobs.append(
            (
                "publish smol",
                lambda: (
                    "smol" in state
                    and publish(out, "smollm2-135m", *state["smol"], state.get("smp"))
                ),
            )
        )
    if "big" in parts:

        def big():
            st, cfg = train_mfu(
                out,
                "qwen2.5-1.5b",
                4 if q else 16,
                64 if q else 1024,
                2 if q else 4,
                2 if q else 4,
                q,
                state.get("ceil", ceil),
            )
            publish(out, "qwen2.5-1.5b", st, cfg, None)

        jobs.append(("train big", big))
    for label, job in jobs:
        t0 = time.perf_counter()
        try:
            r = job()
            if label == "ceiling":
                state["ceil"] = r
        except Exception as e:  # report and go on with the other parts
            traceback.print_exc()
            log(out, f"error[{label}]", repr(e)[:2000])
        print(f"-- {label} took {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
