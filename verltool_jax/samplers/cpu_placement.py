"""Where a vLLM CPU engine runs: its cores, its KV cache and its batch limit, chosen from
the machine and from what runs beside it.

vLLM's CPU backend reads these from the environment when an engine starts:
``VLLM_CPU_OMP_THREADS_BIND`` (the cores its OpenMP threads are pinned to),
``VLLM_CPU_NUM_OF_RESERVED_CPU`` (cores kept free for its scheduler/front end) and
``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache); ``max_num_seqs`` is an engine argument.
Left on ``auto``, vLLM reserves one core per rank for the scheduler, which on a 2-core
machine pins all the model's compute to a single core. The rules here:

* cores: every core this process may use when the engine runs alone (a synchronous loop:
  rollout, then training); when the trainer computes while the engine generates
  (``rollout.mode="async"`` in one process), the engine gets the first ``ceil(n/2)``
  and the trainer keeps the rest;
* reserved: one core (left out of the bind list) only when the engine has >= 8 cores, where
  a scheduler core costs < 1/8 of the compute; below that the scheduler shares the cores;
* KV cache: enough for ``max_num_seqs_cap`` sequences at full ``max_model_len``, capped at
  a share of the available memory (1/4 alone, 1/8 beside a trainer; the machine may be shared), at least 1 GiB;
* max_num_seqs: ``max_num_seqs_cap``, lowered so the admitted sequences fit the KV cache
  at a quarter of ``max_model_len`` each on average (vLLM preempts beyond that).

Variables the user already set in the environment win (:func:`apply_env`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

GIB = 2**30
MIN_CORES_TO_RESERVE = 8


@dataclass(frozen=True)
class CpuPlacement:
    cores: tuple[int, ...]
    reserved: int
    kvcache_gib: int
    max_num_seqs: int
    reason: str

    def env(self) -> dict[str, str]:
        """The vLLM CPU environment variables of this placement."""
        return {
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in self.cores),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": str(self.reserved),
            "VLLM_CPU_KVCACHE_SPACE": str(self.kvcache_gib),
        }


def kv_bytes_per_token(hf_config: Mapping, dtype_bytes: int) -> int:
    """``2 (k and v) * layers * kv_heads * head_dim * dtype_bytes`` from an HF config.json."""
    heads = int(hf_config["num_attention_heads"])
    kv_heads = int(hf_config.get("num_key_value_heads") or heads)
    head_dim = int(hf_config.get("head_dim") or hf_config["hidden_size"] // heads)
    return 2 * int(hf_config["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes


def choose_cpu_placement(
    cores: Sequence[int],
    available_bytes: int,
    *,
    trainer_overlaps: bool,
    max_model_len: int,
    kv_token_bytes: int,
    max_num_seqs_cap: int = 256,
) -> CpuPlacement:
    """The placement of one CPU engine (rules in the module docstring).

    ``cores``: the cores this process may use (``os.sched_getaffinity(0)``);
    ``available_bytes``: free memory; ``trainer_overlaps``: the trainer computes in this
    process while the engine generates.
    """
    cores = tuple(sorted(cores))
    if not cores:
        raise ValueError("cores must name at least one CPU core")
    if max_model_len < 1 or kv_token_bytes < 1 or max_num_seqs_cap < 1:
        raise ValueError("max_model_len, kv_token_bytes and max_num_seqs_cap must be >= 1")
    if trainer_overlaps and len(cores) > 1:
        mine = cores[: math.ceil(len(cores) / 2)]
        why = f"trainer overlaps: engine gets {len(mine)} of {len(cores)} cores"
    else:
        mine = cores
        why = f"engine alone: all {len(cores)} cores"
    reserved = 1 if len(mine) >= MIN_CORES_TO_RESERVE else 0
    bind = mine[: len(mine) - reserved]
    why += (
        ", 1 kept for the scheduler"
        if reserved
        else ", none reserved for the scheduler (< 8 cores)"
    )
    share = 0.125 if trainer_overlaps else 0.25
    need = max_num_seqs_cap * max_model_len * kv_token_bytes
    kv_gib = max(1, min(math.ceil(need / GIB), int(available_bytes * share // GIB)))
    fit = (kv_gib * GIB // kv_token_bytes) // max(1, max_model_len // 4)
    max_seqs = max(1, min(max_num_seqs_cap, int(fit)))
    why += f", KV cache {kv_gib} GiB (<= {share:.0%} of free memory), max_num_seqs {max_seqs}"
    return CpuPlacement(bind, reserved, kv_gib, max_seqs, why)


def apply_env(
    placement: CpuPlacement, environ: MutableMapping[str, str] = os.environ
) -> dict[str, str]:
    """Set the placement's variables in ``environ`` where the user has not set them;
    returns the ones set."""
    applied = {k: v for k, v in placement.env().items() if k not in environ}
    environ.update(applied)
    return applied


def machine_placement(
    hf_config: Mapping,
    dtype_bytes: int,
    *,
    trainer_overlaps: bool,
    max_model_len: int,
    max_num_seqs_cap: int = 256,
) -> CpuPlacement:
    """:func:`choose_cpu_placement` for this process's cores and free memory."""
    import psutil

    return choose_cpu_placement(
        sorted(os.sched_getaffinity(0)),
        psutil.virtual_memory().available,
        trainer_overlaps=trainer_overlaps,
        max_model_len=max_model_len,
        kv_token_bytes=kv_bytes_per_token(hf_config, dtype_bytes),
        max_num_seqs_cap=max_num_seqs_cap,
    )
