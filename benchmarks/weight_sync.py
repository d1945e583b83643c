"""Weight-sync throughput for a SmolLM2-135M-shaped model (fp32, ~540 MB), beside memcpy.

    python benchmarks/weight_sync.py [--repeats 3] [--skip-server] [--skip-inprocess]

A random llama model of SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads / 3 KV,
intermediate 1536, vocab 49152, tied embeddings) is built once as an HF checkpoint
(``$TMPDIR/weight_sync_bench``). Trainer-side Flax params are pushed as the trainer
does it (``update_weights``: params -> HF names -> bucketed shared memory -> the engine's
in-place ``reload_weights`` -> prefix-cache reset), to

* the in-process vLLM CPU engine (``VLLMSampler``), and
* a local ``vllm`` OpenAI-compatible server (``RemoteVLLMSampler``, dev routes),

and printed as effective GB/s = payload bytes / end-to-end seconds (median of
``--repeats`` after one warm-up), with its pack (to shared memory) and load (engine) parts,
beside ``memcpy``: one ``np.copyto`` of the same bytes into a warm buffer.
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

SMOLLM2_135M = dict(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                    intermediate_size=1536, tie_word_embeddings=True)
VOCAB = 49152


def build_checkpoint(root: Path) -> Path:
    from verltool_jax.models.tiny import build_tiny_hf
    if not (root / "config.json").is_file():
        build_tiny_hf(root, family="llama", vocab_size=VOCAB, max_position_embeddings=1024,
                      **SMOLLM2_135M)
    return root


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


def time_syncs(sampler, params_list, repeats: int) -> dict:
    rows = []
    for v in range(repeats + 1):
        sampler.update_weights(params_list[v % 2], v + 1)
        rows.append(dict(sampler.last_sync))
    rows = rows[1:]
    return {k: statistics.median(r[k] for r in rows)
            for k in ("sync_seconds", "pack_seconds", "load_seconds", "sync_bytes")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-inprocess", action="store_true")
    args = ap.parse_args()

    import jax
    import numpy as np
    from flax import nnx

    from verltool_jax.models.config import ModelConfig
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.samplers.weight_sync import named_tensors_from_params

    ckpt = build_checkpoint(Path(tempfile.gettempdir()) / "weight_sync_bench")
    model = load_hf(ckpt)
    _, params = nnx.split(model, nnx.Param)
    params2 = jax.tree.map(lambda x: x * 1.01, params)
    named = list(named_tensors_from_params(params, ModelConfig.from_pretrained(ckpt)))
    nbytes = sum(a.nbytes for _, a in named)
    mc = memcpy_seconds([np.asarray(a) for _, a in named], args.repeats)
    rows = [("memcpy (np.copyto, same bytes)", mc, float("nan"), float("nan"))]

    if not args.skip_inprocess:
        from verltool_jax.samplers.vllm_sampler import VLLMSampler
        s = VLLMSampler(ckpt, max_model_len=512, name="bench-inproc")
        try:
            r = time_syncs(s, [params2, params], args.repeats)
        finally:
            s.close()
        rows.append(("vLLM in-process engine", r["sync_seconds"], r["pack_seconds"],
                     r["load_seconds"]))
    if not args.skip_server:
        from verltool_jax.samplers.remote_vllm import RemoteVLLMSampler, VLLMServer
        log = Path(tempfile.gettempdir()) / "weight_sync_bench_server.log"
        with VLLMServer(str(ckpt), max_model_len=512, log_path=str(log), max_num_seqs=16) as srv:
            s = RemoteVLLMSampler(srv.url)
            try:
                r = time_syncs(s, [params2, params], args.repeats)
            finally:
                s.close()
        rows.append(("local vllm server (HTTP + shm)", r["sync_seconds"], r["pack_seconds"],
                     r["load_seconds"]))

    print(f"\n== weight sync: SmolLM2-135M shape, fp32, {nbytes / 1e6:.1f} MB, median of "
          f"{args.repeats} after a warm-up, {os.cpu_count()} CPU cores ==")
    print(f"{'path':<34}{'seconds':>9}{'GB/s':>8}{'pack s':>8}{'load s':>8}")
    for name, sec, pack, load in rows:
        print(f"{name:<34}{sec:>9.3f}{nbytes / sec / 1e9:>8.2f}{pack:>8.3f}{load:>8.3f}")


if __name__ == "__main__":
    main()
