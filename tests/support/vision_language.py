"""Shared test support for the vision-language model tests: tiny random Qwen2.5-VL / Qwen2-VL
checkpoints built from a config object (no download), images through transformers' own
Qwen2-VL image processor (the PIL one: it needs no torchvision), and padded batches with
the placeholder runs the processor's chat template would write.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np

_ROOT = Path(tempfile.mkdtemp(prefix="vtj_vl_"))
atexit.register(shutil.rmtree, _ROOT, True)

VOCAB = 300
IMAGE, VIDEO, START, END = 290, 291, 292, 293
PATCH, MERGE, TEMPORAL = 4, 2, 2


def hf_config(kind: str):
    """A tiny transformers config of ``kind`` (``qwen2_5_vl`` or ``qwen2_vl``): text hidden 64,
    4 heads / 2 kv heads (head_dim 16, M-RoPE sections 2+3+3), vision width 32, 4 blocks,
    patches of 4 px, windows of 16 px (2x2 merged tokens), full attention in blocks 1, 3."""
    text = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
    )
    ids = dict(
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=START,
        vision_end_token_id=END,
    )
    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        vision = dict(
            depth=4,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            out_hidden_size=64,
            patch_size=PATCH,
            window_size=16,
            fullatt_block_indexes=[1, 3],
            spatial_merge_size=MERGE,
            temporal_patch_size=TEMPORAL,
        )
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    from transformers import Qwen2VLConfig

    vision = dict(
        depth=2,
        embed_dim=32,
        mlp_ratio=2,
        num_heads=2,
        hidden_size=64,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=TEMPORAL,
    )
    return Qwen2VLConfig(text_config=text, vision_config=vision, **ids)


@functools.cache
def vl_model_config(kind: str = "qwen2_5_vl"):
    """Our ``ModelConfig`` of ``hf_config(kind)``."""
    from verltool_jax.models import ModelConfig

    return ModelConfig.from_hf_dict(hf_config(kind).to_dict())


def hf_class(kind: str):
    import transformers

    return {
        "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
        "qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
    }[kind]


@functools.cache
def tiny_vl_ckpt(kind: str = "qwen2_5_vl") -> Path:
    """A saved tiny checkpoint whose every tensor got N(0, 0.1) noise (so that a swapped
    norm, a dropped bias or a transposed kernel shows in the logits)."""
    import torch

    torch.manual_seed(0)
    model = hf_class(kind)(hf_config(kind))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    d = _ROOT / kind
    model.save_pretrained(d)
    return d


def hf_model(path, kind: str = "qwen2_5_vl"):
    import torch

    return (
        hf_class(kind)
        .from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        .eval()
    )


def processor():
    """transformers' Qwen2-VL image processor (PIL backend) for the tiny patch geometry."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=PATCH,
        temporal_patch_size=TEMPORAL,
        merge_size=MERGE,
        min_pixels=64,
        max_pixels=64 * 64,
    )


def images(seed: int = 0):
    """Two RGB uint8 images of different sizes: 24x40 (3x5 merged tokens, windows cut
    at the edge) and 20x12 (resized by the processor to a multiple of 8)."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 256, (24, 40, 3), dtype=np.uint8),
        rng.integers(0, 256, (20, 12, 3), dtype=np.uint8),
    ]


def process(imgs):
    """``(pixel_values [N, 3*2*4*4], image_grid_thw [n, 3])`` from the processor."""
    out = processor()(images=list(imgs), return_tensors="np")
    return np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_grid_thw"])


def vl_batch(grids, side: str = "left", seed: int = 0):
    """Three rows, padded on ``side``: row 0 holds image 0 between text, row 1 images 1 and 0
    (different sizes) with text around, row 2 text only; each image is ``<vision_start>
    <image> <vision_end>`` with the image token expanded as the processor does
    (``expand_image_tokens``). Returns ``(ids, mask, order)`` with ``order`` the image
    indices in row-major placeholder order."""
    from verltool_jax.models.vision_language import expand_image_tokens

    cfg = vl_model_config()
    rng = np.random.default_rng(seed)

    def text(n):
        return [int(t) for t in rng.integers(3, 280, n)]

    img = [START, IMAGE, END]
    rows = [
        expand_image_tokens(text(3) + img + text(4), [grids[0]], cfg),
        expand_image_tokens(text(2) + img + text(3) + img + text(2), [grids[1], grids[0]], cfg),
        text(7),
    ]
    T = max(len(r) for r in rows) + 2
    ids = np.zeros((len(rows), T), np.int64)
    mask = np.zeros((len(rows), T), np.int64)
    for b, r in enumerate(rows):
        sl = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        ids[b, sl] = r
        mask[b, sl] = 1
    return ids, mask, [0, 1, 0]


def hf_vl_logits(model, ids, mask, pixel_values, grid):
    """transformers logits, with its own M-RoPE positions (``get_rope_index``)."""
    import torch

    kw = {}
    if pixel_values is not None:
        kw = dict(
            pixel_values=torch.tensor(pixel_values),
            image_grid_thw=torch.tensor(grid),
            mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)),
        )
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), **kw)
    return out.logits.float().numpy()
