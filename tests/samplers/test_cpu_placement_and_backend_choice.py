"""The vLLM CPU engine's placement (cores, reserved cores, KV cache, batch limit) and the
sampler backend choice: pure rules, checked without starting an engine."""

import math

import pytest

from verltool_jax.run_config import default_config_dict, run_config_from_dict
from verltool_jax.samplers.cpu_placement import (
    GIB,
    CpuPlacement,
    apply_env,
    choose_cpu_placement,
    kv_bytes_per_token,
)
from verltool_jax.samplers.factory import CPU_FASTER, choose_backend

SMOL = {
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "num_hidden_layers": 30,
    "hidden_size": 576,
}


def place(cores, overlaps, free_gib=16, max_len=1024, kv=46080, cap=256):
    return choose_cpu_placement(
        cores,
        free_gib * GIB,
        trainer_overlaps=overlaps,
        max_model_len=max_len,
        kv_token_bytes=kv,
        max_num_seqs_cap=cap,
    )


def test_kv_bytes_per_token_of_smollm2_shape():
    assert kv_bytes_per_token(SMOL, 4) == 2 * 30 * 3 * 64 * 4 == 46080
    no_gqa = {"num_attention_heads": 4, "num_hidden_layers": 2, "hidden_size": 256}
    assert kv_bytes_per_token(no_gqa, 2) == 2 * 2 * 4 * 64 * 2


def test_two_cores_alone_bind_both_and_reserve_none():
    p = place([1, 0], overlaps=False)
    assert p.cores == (0, 1) and p.reserved == 0
    assert p.env()["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert p.env()["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_trainer_overlapping_gets_the_other_half():
    assert place([0, 1], overlaps=True).cores == (0,)
    assert place([0, 1, 2], overlaps=True).cores == (0, 1)
    assert place([5], overlaps=True).cores == (5,)  # one core: nothing to split


def test_a_scheduler_core_is_reserved_only_on_big_machines():
    big = place(range(16), overlaps=False)
    assert big.reserved == 1 and big.cores == tuple(range(15))
    half = place(range(16), overlaps=True)
    assert half.reserved == 1 and half.cores == tuple(range(7))
    assert place(range(4), overlaps=False).reserved == 0


def test_kv_cache_is_what_the_batch_needs_capped_by_free_memory():
    # need: 8 seqs x 1024 tokens x 46080 B = 0.35 GiB -> 1 GiB (the floor), all 8 seqs fit
    small = place([0, 1], False, free_gib=16, cap=8)
    assert small.kvcache_gib == 1 and small.max_num_seqs == 8
    # need 256 x 1024 x 46080 B = 11.25 GiB; a quarter of 16 GiB free = 4 GiB
    alone = place([0, 1], False, free_gib=16)
    assert alone.kvcache_gib == 4
    assert alone.max_num_seqs == min(256, (4 * GIB // 46080) // (1024 // 4))
    beside = place([0, 1], True, free_gib=16)
    assert beside.kvcache_gib == 2 and beside.max_num_seqs < alone.max_num_seqs
    starved = place([0, 1], False, free_gib=1)
    assert starved.kvcache_gib == 1  # never below 1 GiB
    roomy = place([0, 1], False, free_gib=200)
    assert roomy.kvcache_gib == math.ceil(256 * 1024 * 46080 / GIB) and roomy.max_num_seqs == 256


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="cores"):
        place([], False)
    with pytest.raises(ValueError, match="max_model_len"):
        place([0], False, max_len=0)


def test_apply_env_keeps_what_the_user_set():
    env = {"VLLM_CPU_KVCACHE_SPACE": "3"}
    set_ = apply_env(CpuPlacement((0, 1), 0, 5, 64, "x"), env)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and "VLLM_CPU_KVCACHE_SPACE" not in set_
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_backend_choice():
    assert choose_backend("auto", vllm_installed=True, platform="gpu")[0] == "vllm"
    backend, why = choose_backend("auto", vllm_installed=True, platform="cpu")
    assert backend == CPU_FASTER and "CPU" in why
    assert choose_backend("auto", vllm_installed=False, platform="gpu") == (
        "jax",
        "auto: vLLM is not installed",
    )
    assert choose_backend("vllm", vllm_installed=True, platform="cpu")[0] == "vllm"
    assert choose_backend("jax", vllm_installed=True, platform="gpu")[0] == "jax"
    with pytest.raises(ValueError, match="sampler backend"):
        choose_backend("tgi", vllm_installed=True, platform="cpu")


def test_auto_is_the_config_default_and_a_typo_is_rejected():
    d = default_config_dict()
    assert run_config_from_dict(d).sampler.backend == "auto"
    d.sampler.backend = "vlm"
    with pytest.raises(Exception, match="backend"):
        run_config_from_dict(d)


def test_the_run_resolves_auto_once_for_sampler_and_train_step():
    from verltool_jax.train.build import sampler_backend

    d = default_config_dict()
    backend, why = sampler_backend(run_config_from_dict(d))
    assert backend in ("jax", "vllm") and why.startswith("auto")
    d.sampler.backend = "jax"
    assert sampler_backend(run_config_from_dict(d))[0] == "jax"
