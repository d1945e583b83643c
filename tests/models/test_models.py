"""Flax models vs transformers (PyTorch) on tiny random checkpoints of every family."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support.models import hf_float64, hf_logits, hf_model, padded_batch, tiny_ckpt

from verltool_jax.models import ModelConfig, Transformer
from verltool_jax.models.hf_io import hf_named_tensors, load_hf, save_hf

FAMILIES = [("qwen2", True), ("qwen3", True), ("llama", False)]


def _flax_logits(model, ids, mask):
    return np.asarray(nnx.jit(lambda m, i, a: m(i, a))(model, jnp.asarray(ids), jnp.asarray(mask)))


@pytest.mark.parametrize("family,tie", FAMILIES)
def test_parity_with_transformers_padding_both_sides(family, tie):
    path = tiny_ckpt(family, tie)
    ids, mask = padded_batch()
    ref = hf_logits(hf_model(path), ids, mask)
    model = load_hf(path)
    assert model.config.model_type == family and model.config.tie_word_embeddings == tie
    ours = _flax_logits(model, ids, mask)
    real = mask.astype(bool)
    diff = np.abs(ours - ref)[real].max()
    assert diff <= 1e-4, f"{family}: max abs diff {diff}"
    # the logits are not trivially small: the test would see a wrong weight
    assert np.abs(ref[real]).max() > 1.0
    # padding does not change a row's logits: row 1 unpadded alone gives the same values
    n = int(mask[1].sum())
    alone = _flax_logits(model, ids[1:2, -n:], np.ones((1, n), np.int64))
    np.testing.assert_allclose(alone[0], ours[1, -n:], atol=1e-4)


def _assert_attention_is_the_one_pass(**options) -> ModelConfig:
    """A tiny Llama loaded with attention ``options`` gives the one pass's logits (real
    tokens; also against transformers) and gradients; returns its config."""
    path = tiny_ckpt("llama")
    ids, mask = padded_batch()  # 12 positions, padded both sides
    ref = hf_logits(hf_model(path), ids, mask)
    real = mask.astype(bool)
    one = load_hf(path, attention_query_chunk=0, attention_causal_block=0)
    other = load_hf(path, **options)
    a, b = _flax_logits(one, ids, mask), _flax_logits(other, ids, mask)
    assert np.abs(b - ref)[real].max() <= 1e-4
    np.testing.assert_allclose(b[real], a[real], atol=1e-5, rtol=0)

    def grads(model):
        gd, p = nnx.split(model, nnx.Param)
        f = lambda p: (
            nnx.merge(gd, p)(jnp.asarray(ids), jnp.asarray(mask)) * jnp.asarray(mask)[..., None]
        ).sum()
        return jax.tree.leaves(jax.jit(jax.grad(f))(p))

    for x, y in zip(grads(one), grads(other)):
        x, y = np.asarray(x), np.asarray(y)  # float32 sums in another order: relative
        np.testing.assert_allclose(y, x, atol=1e-4 * np.abs(x).max(), rtol=0)
    return other.config


def test_attention_in_query_chunks_is_the_one_pass_attention():
    """Queries ``attention_query_chunk`` at a time (with a ragged last chunk; the mapped
    path a non-causal mask takes) give the one pass's logits against transformers and the
    same gradient; 0 is one pass."""
    cfg = _assert_attention_is_the_one_pass(attention_query_chunk=5, attention_causal_block=0)
    with pytest.raises(ValueError, match="attention_query_chunk"):
        cfg.replace(attention_query_chunk=-1)


@pytest.mark.parametrize("query_chunk", [0, 4])
def test_causal_blocks_skip_later_keys_and_keep_the_one_pass_result(query_chunk):
    """Queries ``attention_causal_block`` at a time, each block scoring only the keys up to
    its last query (a ragged last block; with and without the memory chunking that
    rematerialises each block): the logits of real tokens match transformers and the one
    pass, gradients match the one pass, and the blocked step's scores are smaller."""
    cfg = _assert_attention_is_the_one_pass(
        attention_causal_block=5, attention_query_chunk=query_chunk
    )
    # the work skipped is visible in the compiled step: its largest score block is
    # [B, N, 5, 12] at most, not [B, N, 12, 12]
    from verltool_jax.models.layers import attention_weights_apply

    B, T, N, K, D = 2, 12, 4, 2, 8
    q = jnp.ones((B, T, N, D))
    kv = jnp.ones((B, T, K, D))
    causal = jnp.tril(jnp.ones((T, T), bool))[None].repeat(B, 0)
    text = (
        jax.jit(lambda q, k, v, m: attention_weights_apply(q, k, v, m, 0, 5))
        .lower(q, kv, kv, causal)
        .as_text()
    )
    assert "2x2x2x12x12" not in text and "2x2x2x5x5" in text and "2x2x2x2x12" in text
    with pytest.raises(ValueError, match="attention_causal_block"):
        cfg.replace(attention_causal_block=-1)
    with pytest.raises(ValueError, match="S == T"):
        attention_weights_apply(q, kv[:, :6], kv[:, :6], causal[:, :, :6], 0, 5)


@pytest.mark.parametrize("family,tie", FAMILIES)
def test_float64_computes_what_transformers_computes(family, tie):
    """With every op in float64 on both sides the logits agree to rounding (float32 leaves
    ~1e-6 of summation-order noise on these tiny models, which could hide a small
    systematic difference such as a RoPE frequency an ulp off)."""
    path = tiny_ckpt(family, tie)
    ids, mask = padded_batch()
    ref = hf_logits(hf_float64(hf_model(path)), ids, mask)
    with jax.enable_x64(True):
        model = load_hf(path, dtype="float64")
        ours = _flax_logits(model, ids, mask)
    assert ours.dtype == ref.dtype == np.float64
    real = mask.astype(bool)
    assert np.abs(ours - ref)[real].max() <= 1e-10


def test_family_switches_from_config_json():
    q2 = load_hf(tiny_ckpt("qwen2")).config
    q3 = load_hf(tiny_ckpt("qwen3")).config
    ll = load_hf(tiny_ckpt("llama", False)).config
    assert (q2.qkv_bias, q2.qk_norm, q2.o_bias) == (True, False, False)
    assert (q3.qkv_bias, q3.qk_norm) == (False, True)
    assert ll.rope_scaling.rope_type == "llama3" and ll.rope_scaling.factor == 8.0
    assert not ll.tie_word_embeddings and ll.num_kv_heads == 2 and ll.num_heads == 4


@pytest.mark.parametrize("family,tie", FAMILIES)
def test_save_hf_reloads_in_transformers(family, tie, tmp_path):
    src = tiny_ckpt(family, tie)
    model = load_hf(src)
    out = save_hf(model, tmp_path / "ckpt")
    ids, mask = padded_batch(seed=1)
    real = mask.astype(bool)
    ref = hf_logits(hf_model(src), ids, mask)
    again = hf_logits(hf_model(out), ids, mask)
    assert np.abs(again - ref)[real].max() <= 1e-5
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == family and cfg["tie_word_embeddings"] == tie


def test_save_hf_sharded_files_and_index(tmp_path):
    model = load_hf(tiny_ckpt("qwen2"))
    out = save_hf(model, tmp_path / "c", max_shard_bytes=200_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1 and all((out / f).exists() for f in files)
    again = load_hf(out)
    for (n1, a), (n2, b) in zip(
        hf_named_tensors(model, model.config), hf_named_tensors(again, again.config)
    ):
        assert n1 == n2
        np.testing.assert_array_equal(a, b)


def test_hf_named_tensors_match_transformers_state_dict():
    path = tiny_ckpt("llama", False)
    model = load_hf(path)
    sd = {k: v.numpy() for k, v in hf_model(path).state_dict().items()}
    ours = dict(hf_named_tensors(nnx.split(model, nnx.Param)[1], model.config))
    assert set(ours) == set(sd)
    for k, v in ours.items():
        assert v.shape == sd[k].shape, k
        np.testing.assert_array_equal(v, sd[k])
    # tied: no lm_head, like HF's own saved file
    tied = load_hf(tiny_ckpt("qwen2"))
    names = [n for n, _ in hf_named_tensors(tied, tied.config)]
    assert "lm_head.weight" not in names and "model.layers.0.self_attn.q_proj.bias" in names


def test_bf16_params_and_compute():
    path = tiny_ckpt("qwen3")
    ids, mask = padded_batch(seed=2)
    ref = hf_logits(hf_model(path), ids, mask)
    model = load_hf(path, dtype="bfloat16")
    params = nnx.state(model, nnx.Param)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    ours = _flax_logits(model, ids, mask)
    assert ours.dtype == np.float32
    real = mask.astype(bool)
    err = np.abs(ours - ref)[real]
    assert err.mean() < 0.05 * np.abs(ref[real]).mean() and err.max() > 1e-6  # really bf16
    # bf16 compute on fp32 params
    mixed = load_hf(path, dtype="bfloat16", param_dtype="float32")
    assert {x.dtype for x in jax.tree.leaves(nnx.state(mixed, nnx.Param))} == {jnp.dtype("float32")}


def test_remat_policies_give_the_same_gradient():
    path = tiny_ckpt("qwen2")
    ids, mask = padded_batch(seed=3)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)

    def grads(policy):
        model = load_hf(path, remat_policy=policy)
        graphdef, params = nnx.split(model, nnx.Param)

        @jax.jit
        def g(p):
            def loss(p):
                logits = nnx.merge(graphdef, p)(ids, mask)
                return (jax.nn.logsumexp(logits, -1) * mask).sum()

            return jax.value_and_grad(loss)(p)

        return g(params)

    (l0, g0), (l1, g1) = grads("none"), grads("full")
    assert abs(float(l0) - float(l1)) < 1e-4
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def _scan_pair(policy: str, num_layers: int, hidden: int, lora_last: int = 0):
    """The same weights in two models, layers unrolled and layers scanned."""
    from verltool_jax.models.lora import with_lora

    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=2,
        num_kv_heads=1,
        head_dim=hidden // 2,
        intermediate_size=2 * hidden,
        model_type="llama",
        remat_policy=policy,
    )
    models = []
    for scan in (False, True):
        m = Transformer(cfg.replace(scan_layers=scan), nnx.Rngs(0))
        if lora_last:
            m = with_lora(m, 4, 8.0, targets=("q_proj", "down_proj"), last_layers=lora_last)
        models.append(m)
    if lora_last:  # non-zero B, so the adapters change the function
        for path, v in nnx.to_flat_state(nnx.state(models[0], nnx.LoRAParam)):
            if path[-1] == "lora_b":
                v.set_value(jax.random.normal(jax.random.PRNGKey(len(path)), v.shape) * 0.05)
    nnx.update(models[1], nnx.state(models[0]))
    return models


def _loss_and_grad(model, ids, mask):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        logits = nnx.merge(graphdef, p, rest)(ids, mask)
        return (jax.nn.log_softmax(logits)[..., 1] * mask).sum()

    f = jax.jit(jax.value_and_grad(loss))
    return f(params), f.lower(params)


@pytest.mark.parametrize("policy", ["none", "full"])
def test_scanned_layers_compute_what_the_unrolled_layers_do(policy):
    """``scan_layers``: runs of identical layers (here 4 plain, then 2 with LoRA adapters)
    go through one ``lax.scan`` each; loss and every gradient equal the layer-by-layer
    forward's, with and without remat."""
    from verltool_jax.models.transformer import layer_runs

    unrolled, scanned = _scan_pair(policy, num_layers=6, hidden=32, lora_last=2)
    assert [len(states) for _, states in layer_runs(scanned.layers)] == [4, 2]
    ids, mask = padded_batch(seed=5)
    ids, mask = jnp.asarray(ids) % 64, jnp.asarray(mask)
    (l0, g0), low0 = _loss_and_grad(unrolled, ids, mask)
    (l1, g1), low1 = _loss_and_grad(scanned, ids, mask)
    assert "while" in low1.as_text() and "while" not in low0.as_text()
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
    leaves0, leaves1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    assert len(leaves0) == len(leaves1) and all(np.abs(a).max() > 0 for a in leaves0)
    for a, b in zip(leaves0, leaves1):
        np.testing.assert_allclose(b, a, atol=3e-6, rtol=1e-5)


def test_scanned_layers_make_remat_lower_the_peak():
    """With remat, the scanned step keeps each layer's input, not the layer's inside: XLA's
    own memory analysis of the compiled step shows the temporaries shrink (measured 4x at
    8 layers x 4 x 512 tokens, hidden 256), where remat of unrolled layers saved nothing on
    this backend."""
    unrolled, scanned = _scan_pair("full", num_layers=4, hidden=64)
    ids = jax.random.randint(jax.random.PRNGKey(0), (4, 256), 0, 64)
    mask = jnp.ones_like(ids)
    temps = [
        _loss_and_grad(m, ids, mask)[1].compile().memory_analysis().temp_size_in_bytes
        for m in (unrolled, scanned)
    ]
    assert temps[1] < 0.5 * temps[0], temps  # 13.8 MB vs 37.9 MB when written


def test_random_init_model_runs_and_bad_input_errors():
    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=64,
    )
    model = Transformer(cfg, nnx.Rngs(0))
    assert nnx.jit(lambda m, x: m(x))(model, jnp.ones((2, 5), jnp.int32)).shape == (2, 5, 64)
    with pytest.raises(ValueError, match="input_ids"):
        model(jnp.ones((5,), jnp.int32))
    with pytest.raises(ValueError, match="attention_mask"):
        model(jnp.ones((2, 5), jnp.int32), jnp.ones((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="num_kv_heads"):
        cfg.replace(num_kv_heads=3)
    with pytest.raises(ValueError, match="remat_policy"):
        cfg.replace(remat_policy="sometimes")
    with pytest.raises(ValueError, match="scan_layers"):
        cfg.replace(scan_layers="yes")
    # None (the default): layers scanned exactly when there is a remat policy
    assert cfg.scan_layers is None and not cfg.scans_layers
    assert cfg.replace(remat_policy="full").scans_layers
    assert cfg.replace(scan_layers=True).scans_layers
    assert not cfg.replace(remat_policy="dots", scan_layers=False).scans_layers
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf_dict({"model_type": "gpt2"})


@pytest.mark.parametrize(
    "head_dim,theta",
    [(64, 100000.0), (64, 10000.0), (128, 500000.0), (128, 1000000.0), (80, 10000.0)],
)
def test_rope_frequencies_match_transformers(head_dim, theta):
    """transformers' own float32 frequencies: identical (within an ulp where torch's
    float32 pow is not correctly rounded, one entry of 128 / 1e6)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from verltool_jax.models.rope import rope_inv_freq

    hf_cfg = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    ref = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_cfg)[0].numpy()
    ours = rope_inv_freq(head_dim, theta)
    assert ours.dtype == ref.dtype == np.float32
    np.testing.assert_array_max_ulp(ours, ref, maxulp=1)
    assert (ours != ref).sum() <= (1 if (head_dim, theta) == (128, 1000000.0) else 0)


@pytest.mark.parametrize(
    "rope",
    [
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        {"rope_type": "linear", "factor": 4.0},
    ],
)
def test_rope_scaling_frequencies_match_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from verltool_jax.models.rope import rope_inv_freq

    hf_cfg = LlamaConfig(
        hidden_size=256,
        num_attention_heads=2,
        head_dim=128,
        rope_parameters={**rope, "rope_theta": 500000.0},
    )
    ref, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg)
    cfg = ModelConfig.from_hf_dict({**hf_cfg.to_dict(), "vocab_size": 8})
    ours = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    np.testing.assert_array_equal(ours, ref.numpy())  # transformers' float32 values exactly
    base = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
    assert not np.allclose(ours, base)  # the scaling did something


def test_hf_named_tensors_accepts_pure_dict_and_bf16():
    model = load_hf(tiny_ckpt("qwen3"), dtype="bfloat16")
    state = nnx.split(model, nnx.Param)[1]
    a = dict(hf_named_tensors(state, model.config))
    b = dict(hf_named_tensors(nnx.to_pure_dict(state), model.config))
    assert a.keys() == b.keys() and "model.layers.1.self_attn.k_norm.weight" in a
    for k in a:
        assert a[k].dtype == b[k].dtype == jnp.bfloat16
        np.testing.assert_array_equal(a[k], b[k])
