"""Where one real RL step's wall time goes, and how much of the machine's cores each part used.

    python benchmarks/rl_step.py --data-dir DATA [--backend auto|jax|vllm] \\
        [--before] [--set rollout.n_samples=2 ...]

Runs ``train()`` on ``configs/vt_math.py:smol`` (SmolLM2-135M-Instruct, the python tool,
math reward) for ``trainer.steps=1`` in ``rollout.mode=sync`` (so the parts run one after
another), with small sizes (overridable with ``--set``), and times the parts by wrapping
the trainer's own calls: eval (``RLLoop.evaluate``), rollout (waiting for the step's groups),
reward, train (``make_batch`` and ``train_on``), sync (``PolicyPublisher.publish``). A watcher thread samples
the CPU time of this process and its children (tool server, engine) every 0.2 s and
charges it to the part running; share = CPU seconds / (wall seconds x cores).
``--before`` starts the vLLM engine with vLLM's own CPU placement (``auto`` binding, one
core reserved) instead of ours, the state before ``samplers/cpu_placement.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = [
    "trainer.steps=1",
    "rollout.mode=sync",
    "trainer.batch_groups=2",
    "rollout.n_samples=2",
    "rollout.max_response_tokens=128",
    "rollout.max_turns=2",
    "sft.steps=0",
    "task.num_eval=4",
    "data.max_eval_examples=4",
    "trainer.ckpt_every=0",
    "logging.progress_bar=false",
    "algo.mini_batch_size=4",
    "algo.micro_batch_size=4",
]


class PartClock:
    """Wall and CPU seconds per named part; the part running is a stack (innermost wins)."""

    def __init__(self):
        import psutil

        self.proc = psutil.Process()
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.stack = ["other"]
        self._last = self._cpu_now()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def _cpu_now(self) -> float:
        t = self.proc.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for c in self.proc.children(recursive=True):
            with contextlib.suppress(Exception):
                ct = c.cpu_times()
                total += ct.user + ct.system
        return total

    def _charge(self):
        now = self._cpu_now()
        with self._lock:
            self.cpu[self.stack[-1]] = self.cpu.get(self.stack[-1], 0.0) + max(
                0.0, now - self._last
            )
            self._last = now

    def _watch(self):
        while not self._stop.wait(0.2):
            self._charge()

    @contextlib.contextmanager
    def part(self, name):
        self._charge()
        self.stack.append(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._charge()
            self.stack.pop()
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - t0

    def wrap_async(self, owner, attr, name):
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        async def wrapped(*a, **k):
            with self.part(name):
                return await fn(*a, **k)

        setattr(owner, attr, wrapped)

    def wrap_sync(self, owner, attr, name):
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def wrapped(*a, **k):
            with self.part(name):
                return fn(*a, **k)

        setattr(owner, attr, wrapped)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True, help="the math data root (task.data_dir)")
    ap.add_argument(
        "--variant", default="smol", help="configs/vt_math.py variant (tiny: a smoke run)"
    )
    ap.add_argument("--backend", default="auto", choices=("auto", "jax", "vllm"))
    ap.add_argument("--before", action="store_true", help="vLLM's own CPU placement")
    ap.add_argument("--set", nargs="*", default=[], help="extra config overrides key=value")
    a = ap.parse_args()
    if a.before:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"  # vLLM x86 default:
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "1"  # one core per rank kept
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import psutil
    from ml_collections import config_flags  # noqa: F401  (configs import it)

    sys.path.insert(0, str(ROOT / "configs"))
    import vt_math

    from verltool_jax.rewards.compute import RewardPool
    from verltool_jax.rollout.producer import RolloutProducer
    from verltool_jax.train import trainer
    from verltool_jax.train.policy_version import PolicyPublisher
    from verltool_jax.train.startup import process_start

    cfg = vt_math.get_config(a.variant)
    out = tempfile.mkdtemp(prefix="rl_step_")
    for kv in [
        f"task.data_dir={os.path.abspath(a.data_dir)}",
        f"sampler.backend={a.backend}",
        f"trainer.out_dir={out}",
        *SMALL,
        *a.set,
    ]:
        key, value = kv.split("=", 1)
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        old = node[leaf]
        node[leaf] = type(old)(value) if not isinstance(old, bool) else value == "true"
    clock = PartClock()
    clock.wrap_async(trainer.RLLoop, "evaluate", "eval")
    clock.wrap_async(RolloutProducer, "next_groups", "rollout (waiting for groups)")
    clock.wrap_async(RewardPool, "score_async", "reward")
    clock.wrap_sync(trainer, "make_batch", "train")
    clock.wrap_sync(trainer, "train_on", "train")
    clock.wrap_async(PolicyPublisher, "publish", "sync")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with clock.part("start-up and the rest"):
        trainer.train(cfg, echo=True, started_at=process_start())
    wall = time.perf_counter() - t0
    clock._stop.set()
    cores = len(os.sched_getaffinity(0))
    print(
        f"\n== one RL step, {a.variant} config, backend {a.backend}{' (before: vLLM auto placement)' if a.before else ''}: "
        f"{wall:.1f} s wall, {cores} cores, load average {load0:.1f} -> "
        f"{os.getloadavg()[0]:.1f}, {psutil.cpu_count()} CPUs =="
    )
    print(f"{'part':<30}{'wall s':>9}{'% wall':>8}{'CPU s':>8}{'core share':>11}")
    for name in sorted(clock.wall, key=lambda n: -clock.wall[n]):
        w, c = clock.wall[name], clock.cpu.get(name, 0.0)
        inner = (
            sum(clock.wall[n] for n in clock.wall if n != name) if name.startswith("start") else 0
        )
        w_own = w - inner
        print(
            f"{name:<30}{w_own:>9.1f}{100 * w_own / wall:>7.0f}%{c:>8.1f}"
            f"{100 * c / max(1e-9, w_own * cores):>10.0f}%"
        )


if __name__ == "__main__":
    from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()  # VERLTOOL_MALLOC_HUGEPAGES=0 / _KEEP_FREED=0: without
    main()
