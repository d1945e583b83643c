"""RL train step on CPU: time per step and XLA temp memory vs micro-batch size.

    python benchmarks/train_step.py [--batch 16 --seq 256 --hidden 256 --layers 4 --steps 3]

One GRPO/PPO update (token-mean, AdamW) of a random Qwen2-style ``Transformer`` on a
batch of B right-padded sequences, with the batch processed whole or in micro-batches
(gradient accumulation inside the jitted step). Prints, per micro-batch size: compile
time, mean wall time per step, process CPU time per step (robust to other jobs on the
machine), trained tokens/s (loss-mask tokens / wall time) and the compiled step's XLA
temp buffer size (``memory_analysis().temp_size_in_bytes``), which is what micro-
batching buys. All configurations apply the same update (tested in
tests/test_train_step.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import numpy as np
from flax import nnx

from verltool_jax.algos.config import algo_config
from verltool_jax.algos.optimizer import make_optimizer
from verltool_jax.models.config import ModelConfig
from verltool_jax.models.transformer import Transformer
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step


def make_batch(B, T, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (B, T)).astype(np.int32)
    lengths = rng.integers(T // 2, T + 1, B)
    attn = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    loss_mask = np.zeros((B, T), np.float32)
    for b, n in enumerate(lengths):
        loss_mask[b, T // 4 : n - 1] = 1.0
    lp = np.where(loss_mask > 0, -rng.uniform(0.5, 4.0, (B, T)), 0.0).astype(np.float32)
    return dict(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=loss_mask,
        advantages=rng.normal(size=B).astype(np.float32),
        old_logprobs=lp,
        sampler_logprobs=lp.copy(),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro", type=str, default="0,8,4,2", help="0 = whole batch")
    a = ap.parse_args()
    cfg = ModelConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        num_layers=a.layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=a.hidden // 4,
        intermediate_size=a.hidden * 3,
        tie_word_embeddings=True,
    )
    opt = make_optimizer(dict(lr=1e-5))
    batch = make_batch(a.batch, a.seq, a.vocab)
    tokens = float(batch["loss_mask"].sum())
    print(
        f"# train step: {os.cpu_count()} CPUs, {platform.machine()}, jax {jax.__version__} "
        f"({jax.default_backend()}), B={a.batch} T={a.seq} hidden={a.hidden} "
        f"layers={a.layers} vocab={a.vocab}, {int(tokens)} trained tokens/step, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for micro in [int(m) for m in a.micro.split(",")]:
        state = TrainState.create(Transformer(cfg, nnx.Rngs(0)), opt)
        step = make_train_step(algo_config(micro_batch_size=micro or None), state.graphdef, opt)
        t0 = time.perf_counter()
        compiled = step.lower(state, batch).compile()
        compile_s = time.perf_counter() - t0
        temp = compiled.memory_analysis().temp_size_in_bytes
        state, m = step(state, batch)  # warm-up
        jax.block_until_ready(m)
        wall, cpu = [], []
        for _ in range(a.steps):
            w0, c0 = time.perf_counter(), time.process_time()
            state, m = step(state, batch)
            jax.block_until_ready(m)
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        label = "whole batch" if not micro else f"micro={micro}"
        print(
            f"{label:12s} compile {compile_s:6.1f} s  step {np.mean(wall):7.3f} s  "
            f"CPU/step {np.mean(cpu):7.3f} s  {tokens / np.mean(wall):9.0f} tok/s  "
            f"XLA temp {temp / 2**20:8.1f} MiB  loss {float(m['loss']):+.4f}"
        )


if __name__ == "__main__":
    main()
