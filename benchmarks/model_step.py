"""Forward+backward throughput of the Flax policy vs the same model in PyTorch (transformers),
and peak memory of chunked vs naive token log-probabilities.

    python benchmarks/model_step.py [--batch 4 --seq 256 --steps 5 --threads 1]

Both frameworks run the same random Qwen2-style checkpoint (written by transformers and
loaded with ``load_hf``) and the same loss: the summed log-probability of the next token.
FLOPs are counted analytically (fwd+bwd = 3x forward): 6 * (matmul params) * tokens for
the projections and the LM head, plus 12 * layers * B * T^2 * heads * head_dim for the
attention scores and weighted values over the full T x T (no causal discount).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def build_checkpoint(path, hidden, layers, heads, kv_heads, inter, vocab):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                      intermediate_size=inter, tie_word_embeddings=True,
                      max_position_embeddings=4096)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return cfg


def flops_fwd_bwd(hidden, layers, heads, kv_heads, inter, vocab, B, T) -> float:
    hd = hidden // heads
    per_layer = hidden * (heads * hd) * 2 + hidden * (kv_heads * hd) * 2 + 3 * hidden * inter
    matmul_params = layers * per_layer + hidden * vocab
    dense = 6 * matmul_params * B * T
    attn = 3 * 4 * layers * B * T * T * heads * hd
    return float(dense + attn)


def bench_jax(path, ids, steps):
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from verltool_jax.models.hf_io import load_hf
    from verltool_jax.models.logprobs import token_logprobs

    model = load_hf(path)
    graphdef, params = nnx.split(model, nnx.Param)
    x = jnp.asarray(ids[:, :-1])
    tgt = jnp.asarray(ids[:, 1:])
    mask = jnp.ones_like(x)

    @jax.jit
    def step(p):
        def loss(p):
            return -token_logprobs(nnx.merge(graphdef, p), x, mask, tgt, 1.0, 128).sum()
        return jax.value_and_grad(loss)(p)

    t0 = time.perf_counter()
    jax.block_until_ready(step(params))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(step(params))
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), compile_s


def bench_torch(path, ids, steps):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.train()
    x = torch.tensor(ids[:, :-1])
    tgt = torch.tensor(ids[:, 1:])

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        lp = torch.log_softmax(logits.float(), -1).gather(-1, tgt[..., None])[..., 0]
        (-lp.sum()).backward()

    step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def logprob_memory(B, T, H, V, chunk):
    """Compiled temp bytes of value_and_grad(sum logprobs) w.r.t. (hidden, W_out)."""
    import jax
    import jax.numpy as jnp
    from verltool_jax.models.logprobs import chunked_logprobs, naive_logprobs
    h = jax.ShapeDtypeStruct((B, T, H), jnp.float32)
    w = jax.ShapeDtypeStruct((H, V), jnp.float32)
    t = jax.ShapeDtypeStruct((B, T), jnp.int32)

    def temp(f):
        c = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(h, w, t).compile()
        return c.memory_analysis().temp_size_in_bytes

    chunked = temp(lambda h, w, t: chunked_logprobs(h, w, t, 1.0, chunk).sum())
    naive = temp(lambda h, w, t: naive_logprobs(jnp.einsum("bth,hv->btv", h, w), t).sum())
    return chunked, naive


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=0,
                    help="pin both frameworks to this many CPU threads (0: library defaults)")
    a = ap.parse_args()
    if a.threads:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen="
                                   f"{'true' if a.threads > 1 else 'false'} "
                                   f"intra_op_parallelism_threads={a.threads}")
    import jax
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"machine: {os.cpu_count()} CPUs, jax {jax.__version__} ({jax.devices()[0].platform}), "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as d:
        build_checkpoint(d, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab)
        ids = np.random.default_rng(0).integers(0, a.vocab, (a.batch, a.seq + 1))
        tokens = a.batch * a.seq
        flops = flops_fwd_bwd(a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab,
                              a.batch, a.seq)
        print(f"model: qwen2 hidden={a.hidden} layers={a.layers} heads={a.heads}/{a.kv_heads} "
              f"inter={a.intermediate} vocab={a.vocab}; batch {a.batch} x {a.seq} tokens, fp32")
        tj, cj = bench_jax(d, ids, a.steps)
        tt = bench_torch(d, ids, a.steps)
    print(f"fwd+bwd JAX/Flax : {tj * 1e3:8.1f} ms/step  {tokens / tj:9.0f} tokens/s  "
          f"{flops / tj / 1e9:7.2f} GFLOP/s  (compile {cj:.1f} s)")
    print(f"fwd+bwd PyTorch  : {tt * 1e3:8.1f} ms/step  {tokens / tt:9.0f} tokens/s  "
          f"{flops / tt / 1e9:7.2f} GFLOP/s")
    print(f"throughput ratio JAX / PyTorch: {tt / tj:.2f}x")
    for (B, T, H, V, c) in [(2, 1024, 896, 151936, 128)]:
        ch, nv = logprob_memory(B, T, H, V, c)
        print(f"logprob fwd+bwd peak temp memory, B={B} T={T} H={H} V={V}: "
              f"chunked(chunk={c}) {ch / 2**20:.0f} MiB vs naive {nv / 2**20:.0f} MiB "
              f"({nv / ch:.1f}x less)")


if __name__ == "__main__":
    main()
