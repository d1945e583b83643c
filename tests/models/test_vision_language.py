"""Qwen2.5-VL / Qwen2-VL in Flax vs transformers on tiny random checkpoints: logits with one and
two images of different sizes in left- and right-padded batches, M-RoPE positions, HF
import / export, sharding, chunked logprobs with images, and the bad-input errors."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support.vision_language import (
    END,
    IMAGE,
    START,
    hf_model,
    hf_vl_logits,
    images,
    process,
    tiny_vl_ckpt,
    vl_batch,
)

from verltool_jax.models import ModelConfig, load_hf, save_hf, token_logprobs, vl_inputs
from verltool_jax.models.hf_io import hf_named_tensors
from verltool_jax.models.logprobs import naive_logprobs
from verltool_jax.models.vision import attention_groups, vision_layout
from verltool_jax.models.vision_language import expand_image_tokens, mrope_positions
from verltool_jax.sharding import make_mesh, param_spec


@pytest.fixture(scope="module")
def vl25():
    """(checkpoint path, transformers model, our model, pixel_values, grid) for Qwen2.5-VL;
    the patches are those of images 0, 1, 0 -- the placeholder order of ``vl_batch``."""
    path = tiny_vl_ckpt("qwen2_5_vl")
    imgs = images()
    pv, grid = process([imgs[0], imgs[1], imgs[0]])
    return path, hf_model(path), load_hf(path), pv, grid


@nnx.jit
def _forward(model, ids, mask, positions, images):
    return model(ids, mask, positions, images)


def _logits(model, ids, mask, pv, grid, **kw):
    inp = vl_inputs(model.config, ids, mask, pv, grid, **kw)
    return np.asarray(
        _forward(model, jnp.asarray(ids), jnp.asarray(mask), inp["positions"], inp["images"])
    )


@nnx.jit
def _logprobs(model, ids, mask, targets, positions, images):
    return token_logprobs(
        model, ids, mask, targets, chunk_size=8, positions=positions, images=images
    )


@nnx.jit
def _grad(model, ids, mask, targets, positions, images):
    return nnx.grad(lambda m: -(_logprobs(m, ids, mask, targets, positions, images) * mask).sum())(
        model
    )


@pytest.mark.parametrize("side", ["left", "right"])
def test_qwen2_5_vl_logits_match_transformers(vl25, side):
    path, ref_model, model, pv, grid = vl25
    assert grid.tolist() == [[1, 6, 10], [1, 4, 4], [1, 6, 10]]  # two sizes, windows cut at edges
    ids, mask, _ = vl_batch(grid[:2], side)
    ref = hf_vl_logits(ref_model, ids, mask, pv, grid)
    ours = _logits(model, ids, mask, pv, grid)
    real = mask.astype(bool)
    diff = np.abs(ours - ref)[real].max()
    assert diff <= 1e-4, f"max abs diff {diff}"
    assert np.abs(ref[real]).max() > 1.0
    # the images matter: other pixels change the logits after the first image
    other = _logits(model, ids, mask, pv[::-1].copy(), grid)
    assert np.abs(other - ours)[real].max() > 1e-2


def test_qwen2_vl_logits_match_transformers():
    path = tiny_vl_ckpt("qwen2_vl")
    imgs = images(seed=3)
    pv, grid = process([imgs[0], imgs[1], imgs[0]])
    ids, mask, _ = vl_batch(grid[:2], "left", seed=4)
    ref = hf_vl_logits(hf_model(path, "qwen2_vl"), ids, mask, pv, grid)
    model = load_hf(path)
    assert model.config.vision.kind == "qwen2_vl" and model.config.vision.hidden_act == "quick_gelu"
    ours = _logits(model, ids, mask, pv, grid)
    real = mask.astype(bool)
    assert np.abs(ours - ref)[real].max() <= 1e-4
    # export: transformers reloads our checkpoint to the same logits
    out = save_hf(model, path.parent / "qwen2_vl_export")
    again = hf_vl_logits(hf_model(out, "qwen2_vl"), ids, mask, pv, grid)
    assert np.abs(again - ref)[real].max() <= 1e-5


def test_mrope_positions_equal_get_rope_index(vl25):
    import torch

    _, ref_model, model, pv, grid = vl25
    for side in ("left", "right"):
        ids, mask, _ = vl_batch(grid[:2], side, seed=5)
        want, want_delta = ref_model.model.get_rope_index(
            torch.tensor(ids),
            mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)),
            image_grid_thw=torch.tensor(grid),
            attention_mask=torch.tensor(mask),
        )
        pos, delta = mrope_positions(ids, mask, grid, model.config)
        real = mask.astype(bool)
        np.testing.assert_array_equal(pos[real], want.numpy().transpose(1, 2, 0)[real])
        np.testing.assert_array_equal(delta, want_delta.numpy()[:, 0])
    # a 3x5-token image: text after it resumes at start + max(3, 5)
    ids = np.array([[5, START] + [IMAGE] * 15 + [END, 6]])
    pos, delta = mrope_positions(ids, None, [[1, 6, 10]], model.config)
    assert pos[0, 2].tolist() == [2, 2, 2] and pos[0, 16].tolist() == [2, 4, 6]
    assert pos[0, 17].tolist() == [7, 7, 7] and delta[0] == 8 + 1 - 19


def test_window_segments_equal_transformers_windows(vl25):
    import torch
    from transformers.vision_utils import get_vision_window_index

    model, grid = vl25[2], vl25[4]
    v = model.config.vision
    index, cu = get_vision_window_index(
        torch.tensor(grid), v.spatial_merge_size, v.window_size, v.patch_size
    )
    # HF: merged tokens ``index`` in order, cut at ``cu`` (patch counts) into windows
    units = index.numpy()
    bounds = cu.numpy() // v.spatial_merge_size**2
    hf_window = np.empty(len(units), np.int64)
    for w in range(len(bounds) - 1):
        hf_window[units[bounds[w] : bounds[w + 1]]] = w
    _, full, win = vision_layout(grid, v)
    ours = win[:: v.spatial_merge_size**2]
    same_ours = ours[:, None] == ours[None, :]
    same_hf = hf_window[:, None] == hf_window[None, :]
    np.testing.assert_array_equal(same_ours, same_hf)
    assert len(set(win.tolist())) == 6 + 1 + 6 and set(full.tolist()) == {0, 1, 2}
    # the gathered groups: one row per window (<= 4 merged blocks of 4 patches), -1 padded
    groups = attention_groups(win)
    assert groups.shape == (13, 16)
    for g, row in enumerate(groups):
        members = row[row >= 0]
        assert (win[members] == g).all() and len(members) == (win == g).sum()
        assert (np.diff(members) > 0).all()
    assert attention_groups(np.array([1, -1, 0, 1])).tolist() == [[2, -1], [0, 3]]


def test_padded_patches_and_chunked_logprobs_with_images(vl25):
    _, _, model, pv, grid = vl25
    ids, mask, _ = vl_batch(grid[:2], "right", seed=6)
    full = _logits(model, ids, mask, pv, grid)
    bucketed = vl_inputs(model.config, ids, mask, pv, grid, bucket=True)["images"]
    assert bucketed.pixel_values.shape == (256, 96)  # 136 patches -> 4 * 64
    assert bucketed.full_groups.shape == (4, 64)  # 3 frames of <= 60 patches
    assert bucketed.window_groups.shape == (16, 16)  # 13 windows of <= 16 patches
    padded = _logits(model, ids, mask, pv, grid, bucket=True)
    np.testing.assert_allclose(padded, full, atol=1e-5)
    inp = vl_inputs(model.config, ids, mask, pv, grid)
    targets = jnp.asarray(np.roll(ids, -1, axis=1))
    lp = _logprobs(
        model, jnp.asarray(ids), jnp.asarray(mask), targets, inp["positions"], inp["images"]
    )
    want = naive_logprobs(jnp.asarray(full), targets)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(lp)[real], np.asarray(want)[real], atol=1e-5)


@pytest.mark.slow
def test_logprob_gradient_reaches_the_vision_tower(vl25):
    _, _, model, pv, grid = vl25
    ids, mask, _ = vl_batch(grid[:2], "left", seed=6)
    inp = vl_inputs(model.config, ids, mask, pv, grid)
    targets = jnp.asarray(np.roll(ids, -1, axis=1))
    g = _grad(model, jnp.asarray(ids), jnp.asarray(mask), targets, inp["positions"], inp["images"])
    for path in (
        ("visual", "patch_embed", "kernel"),
        ("visual", "blocks", 0, "attn", "qkv", "kernel"),
        ("visual", "merger", "mlp_out", "bias"),
    ):
        leaf = g
        for p in path:
            leaf = leaf[p]
        arr = np.asarray(leaf[...])
        assert np.isfinite(arr).all() and np.abs(arr).max() > 0, path


def test_save_hf_uses_transformers_names_and_reloads(vl25, tmp_path):
    from verltool_jax.models.safetensors_io import read_header

    path, ref_model, model, pv, grid = vl25
    out = save_hf(model, tmp_path / "vl")
    names = [n for n, _ in hf_named_tensors(model, model.config)]
    hf_written = set(read_header(path / "model.safetensors")[0]) - {"__metadata__"}
    assert sorted(names) == sorted(hf_written)
    assert (
        "visual.patch_embed.proj.weight" in names
        and "model.layers.0.self_attn.q_proj.bias" in names
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_5_vl"
    assert cfg["text_config"]["rope_parameters"]["mrope_section"] == [2, 3, 3]
    assert cfg["vision_config"]["fullatt_block_indexes"] == [1, 3]
    ids, mask, _ = vl_batch(grid[:2], "left", seed=7)
    real = mask.astype(bool)
    want = hf_vl_logits(ref_model, ids, mask, pv, grid)
    again = hf_vl_logits(hf_model(out), ids, mask, pv, grid)
    assert np.abs(again - want)[real].max() <= 1e-5
    # the model.language_model.* / model.visual.* spelling (the module tree; transformers
    # 4.52-4.57 wrote it to disk) loads too
    from safetensors.torch import save_file

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text((out / "config.json").read_text())
    sd = {k: v.contiguous() for k, v in ref_model.state_dict().items()}
    assert any(k.startswith("model.visual.") for k in sd)
    assert any(k.startswith("model.language_model.") for k in sd)
    save_file(sd, str(legacy / "model.safetensors"))
    reloaded = load_hf(legacy)
    for (n1, a), (n2, b) in zip(
        hf_named_tensors(model, model.config), hf_named_tensors(reloaded, reloaded.config)
    ):
        assert n1 == n2
        np.testing.assert_array_equal(a, b)


def test_hub_flat_config_reads_like_the_nested_one(vl25):
    nested = vl25[2].config
    d = nested.to_hf_dict()
    flat = {**d, **d.pop("text_config")}
    flat.pop("rope_parameters")
    flat.update(
        rope_theta=nested.rope_theta,
        model_type="qwen2_5_vl",
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
    )
    flat["vision_config"] = {**flat["vision_config"], "in_chans": 3}
    flat["vision_config"].pop("in_channels")
    assert ModelConfig.from_hf_dict(flat) == nested
    assert nested.qkv_bias and not nested.o_bias and nested.mrope_section == (2, 3, 3)


@pytest.mark.skipif(
    jax.device_count() < 8,
    reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (scripts/test.sh sets it)",
)
def test_sharded_vl_model_places_every_param_and_matches(vl25):
    path, _, model, pv, grid = vl25
    mesh = make_mesh((1, 4, 2))
    sharded = load_hf(path, mesh=mesh)
    flat = dict(nnx.to_flat_state(nnx.state(sharded, nnx.Param)))
    assert any(p[0] == "visual" for p in flat)
    for p, var in flat.items():
        arr = var.get_value()
        assert arr.sharding.spec == param_spec(p, arr.shape, mesh), p
    qkv = flat[("visual", "blocks", 0, "attn", "qkv", "kernel")].get_value()
    assert {s.data.shape for s in qkv.addressable_shards} == {(32 // 4, 96 // 2)}
    ids, mask, _ = vl_batch(grid[:2], "left", seed=9)
    with jax.set_mesh(mesh):
        got = _logits(sharded, ids, mask, pv, grid)
    np.testing.assert_allclose(got, _logits(model, ids, mask, pv, grid), atol=1e-4)


def test_bad_inputs_name_the_problem(vl25):
    _, _, model, pv, grid = vl25
    cfg = model.config
    ids, mask, _ = vl_batch(grid[:2], "left")
    with pytest.raises(ValueError, match="image tokens"):
        vl_inputs(cfg, ids, mask, pv[:-4], np.array([[1, 6, 10], [1, 4, 4], [1, 6, 8]]))
    with pytest.raises(ValueError, match="pixel_values has shape"):
        vl_inputs(cfg, ids, mask, pv[:, :-1], grid)
    with pytest.raises(ValueError, match="multiples of spatial_merge_size"):
        vl_inputs(cfg, ids, mask, pv, np.array([[1, 5, 10], [1, 4, 4], [1, 7, 10]]))
    with pytest.raises(ValueError, match="positions"):
        model(
            jnp.asarray(ids),
            jnp.asarray(mask),
            images=vl_inputs(cfg, ids, mask, pv, grid)["images"],
        )
    text_cfg = cfg.replace(model_type="qwen2", vision=None, mrope_section=())
    with pytest.raises(ValueError, match="text-only"):
        vl_inputs(text_cfg, ids, mask, pv, grid)
    assert (
        expand_image_tokens([5, START, IMAGE, END, IMAGE], [[1, 6, 10], [1, 4, 4]], cfg)
        == [5, START] + [IMAGE] * 15 + [END] + [IMAGE] * 4
    )
    with pytest.raises(ValueError, match="more image tokens"):
        expand_image_tokens([IMAGE, IMAGE], [[1, 4, 4]], cfg)
    with pytest.raises(ValueError, match="more rows"):
        expand_image_tokens([IMAGE], [[1, 4, 4], [1, 4, 4]], cfg)
    with pytest.raises(ValueError, match="mrope_section"):
        cfg.replace(mrope_section=(2, 3, 4))
    with pytest.raises(ValueError, match="out_hidden_size"):
        cfg.replace(hidden_size=32, head_dim=8, mrope_section=(2, 1, 1))


# Qwen2.5-VL-7B-Instruct's config.json as published on the hub (flat layout, legacy mrope).
HUB_QWEN2_5_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "model_type": "qwen2_5_vl",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 152064,
}


def _shapes_vs_transformers(hub: dict) -> int:
    """Our HF names and shapes (abstract, nothing allocated) equal those of transformers'
    model built on the meta device from the same dict; returns the parameter count."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from verltool_jax.models.hf_io import _flat_params, _value
    from verltool_jax.models.name_maps import canonical_hf_name, param_table
    from verltool_jax.models.vision_language import model_class

    cfg = ModelConfig.from_hf_dict(hub)
    flat = _flat_params(nnx.eval_shape(lambda: model_class(cfg)(cfg, nnx.Rngs(0))))
    ours = {}
    for m in param_table(cfg):
        shape = tuple(_value(flat[m.path]).shape)
        ours[m.hf_name] = m.hf_shape or (shape[::-1] if m.transpose else shape)
    with torch.device("meta"):
        ref = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**hub))
    theirs = {canonical_hf_name(k): tuple(v.shape) for k, v in ref.state_dict().items()}
    assert ours == theirs
    return sum(int(np.prod(s)) for s in ours.values())


def test_hub_7b_widths_match_transformers():
    """Every tensor name and shape at the real widths (2 decoder layers, 8 vision blocks)."""
    hub = {
        **HUB_QWEN2_5_VL_7B,
        "num_hidden_layers": 2,
        "max_window_layers": 2,
        "vision_config": {
            **HUB_QWEN2_5_VL_7B["vision_config"],
            "depth": 8,
            "fullatt_block_indexes": [7],
        },
    }
    cfg = ModelConfig.from_hf_dict(hub)
    assert cfg.mrope_section == (16, 24, 24) and cfg.head_dim == 128 and cfg.rope_theta == 1e6
    assert cfg.vision.patch_dim == 3 * 2 * 14 * 14 and cfg.vision.in_channels == 3
    _shapes_vs_transformers(hub)


@pytest.mark.slow
def test_hub_7b_full_model_has_8_29b_parameters():
    assert _shapes_vs_transformers(HUB_QWEN2_5_VL_7B) == 8_292_166_656


@pytest.mark.slow
def test_bf16_and_remat_run_the_vision_tower(vl25):
    path, _, model, pv, grid = vl25
    ids, mask, _ = vl_batch(grid[:2], "left", seed=10)
    real = mask.astype(bool)
    full = _logits(model, ids, mask, pv, grid)
    bf16 = _logits(load_hf(path, dtype="bfloat16"), ids, mask, pv, grid)
    assert np.isfinite(bf16).all() and np.abs(bf16 - full)[real].max() < 0.25
    inp = vl_inputs(model.config, ids, mask, pv, grid, bucket=True)
    args = (
        jnp.asarray(ids),
        jnp.asarray(mask),
        jnp.asarray(np.roll(ids, -1, axis=1)),
        inp["positions"],
        inp["images"],
    )
    g_full = _grad(load_hf(path, remat_policy="full"), *args)
    g_none = _grad(model, *args)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_none)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
