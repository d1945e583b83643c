"""Matmul rate of XLA on CPU under its library-fusion flags, each in its own process.

    python benchmarks/xla_cpu_flags.py [--m 2048] [--k 576] [--n 1536] [--repeats 20]

The train step's layer matmuls run at ~130-150 GFLOP/s inside the step and ~190 alone
(docs/performance.md); this asks whether XLA's CPU options route dots to a faster
library. For each setting of ``XLA_FLAGS`` a child process times a jitted
``tanh(x @ w) @ w.T`` (two fp32 matmuls, the shape of a SmolLM2 MLP projection over
``--m`` tokens) and its gradient with respect to ``x`` and ``w`` (six matmuls), on the
cores this process may use, and prints GFLOP/s. An option the installed XLA does not
know ends its child with an error, printed as such.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

SETTINGS = (
    "",
    "--xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "--xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "--xla_cpu_use_onednn=true",
    "--xla_cpu_use_xnnpack=true",
)

CHILD = """
import sys, time
import jax, jax.numpy as jnp
m, k, n, repeats = map(int, sys.argv[1:5])
x = jax.random.normal(jax.random.PRNGKey(0), (m, k))
w = jax.random.normal(jax.random.PRNGKey(1), (k, n))
fwd = jax.jit(lambda x, w: jnp.tanh(x @ w) @ w.T)
grad = jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.tanh(x @ w) @ w.T), argnums=(0, 1)))
def rate(fn, matmuls):
    jax.block_until_ready(fn(x, w))
    t = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(x, w))
    return matmuls * 2 * m * k * n / ((time.perf_counter() - t) / repeats) / 1e9
print(f"{rate(fwd, 2):.0f} {rate(grad, 6):.0f}")
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2048, help="rows (tokens)")
    ap.add_argument("--k", type=int, default=576, help="inner size (hidden)")
    ap.add_argument("--n", type=int, default=1536, help="columns (MLP width)")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    print(
        f"== XLA CPU matmul rate, {a.m}x{a.k}x{a.n} fp32, {cores} cores, mean of "
        f"{a.repeats}, load average {os.getloadavg()[0]:.2f} =="
    )
    print(f"{'XLA_FLAGS':<68}{'fwd GFLOP/s':>12}{'grad GFLOP/s':>13}")
    for flags in SETTINGS:
        env = {**os.environ, "XLA_FLAGS": flags}
        args = [sys.executable, "-c", CHILD, *map(str, (a.m, a.k, a.n, a.repeats))]
        r = subprocess.run(args, env=env, capture_output=True, text=True)
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["?"])[-1][:60]
            print(f"{flags or '(none)':<68}  failed: {last}")
            continue
        fwd, grad = r.stdout.split()
        print(f"{flags or '(none)':<68}{fwd:>12}{grad:>13}")


if __name__ == "__main__":
    main()
