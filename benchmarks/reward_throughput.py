"""Reward scoring throughput: in-process vs the RewardPool's worker processes.

    python benchmarks/reward_throughput.py [--n 400] [--workers 2]

Scores ``n`` tiny_math responses (numeric answers, half correct) and ``n // 4`` distinct
symbolic math answers (math-verify/sympy path), and prints items per second for each
mode (start-up and the verifier's one-off warm-up are not timed).
"""

from __future__ import annotations

import argparse
import random
import time

from verltool_jax.rewards import RewardPool
from verltool_jax.tasks.tiny_math import generate


def workload(n: int, seed: int = 0) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    train, _, _ = generate(n, 0, 0, seed=seed)
    items = []
    for row in train:
        p = int(row["reward_model"]["ground_truth"]) + rng.choice([0, 1])
        items.append((f"<python>print(...)</python><answer>{p}</answer>", row))
    for k in range(1, n // 4 + 1):  # all distinct, so no verifier cache hits
        pred, gold = [
            (f"x^2+{2 * k}x+{k * k}", f"(x+{k})^2"),
            (rf"\frac{{{k}}}{{{2 * k}}}", "0.5"),
            (rf"\sqrt{{{4 * k * k}}}", f"{2 * k}"),
            (f"{k}x+{k}", f"{k}(x+1)"),
        ][k % 4]
        items.append(
            (rf"\boxed{{{pred}}}", {"data_source": "math", "reward_model": {"ground_truth": gold}})
        )
    return items


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    items = workload(args.n)
    for workers in (0, args.workers):
        with RewardPool(num_workers=workers, timeout_s=10.0) as pool:
            pool.score(items[:1])  # start-up (and the verifier's warm-up) untimed
            if workers == 0:
                from verltool_jax.rewards.math_reward import warm_up

                warm_up()
            t0 = time.perf_counter()
            res = pool.score(items)
            dt = time.perf_counter() - t0
        acc = sum(r.correct for r in res) / len(res)
        print(
            f"workers={workers}: {len(items)} items in {dt:.2f}s = "
            f"{len(items) / dt:.0f} items/s (accuracy {acc:.2f})"
        )


if __name__ == "__main__":
    main()
