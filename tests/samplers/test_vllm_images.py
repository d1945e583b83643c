"""The vLLM sampler with images: a tiny Qwen2.5-VL served by the real vLLM CPU engine.

The engine runs in its own process (``support/vllm_vl_check.py``): torchvision, which
vLLM's Qwen2-VL code imports, must be made importable before transformers is first
imported (``samplers.torchvision_cpu``), and this session imported it long ago.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from verltool_jax.samplers.base import SamplerRequestError, SamplingParams

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vl_check(tmp_path_factory):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]
        ),
    )
    r = subprocess.run(
        [sys.executable, "-m", "support.vllm_vl_check", str(tmp_path_factory.mktemp("vllm_vl"))],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, out[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_vllm_serves_images_with_the_trainers_logprobs(vl_check):
    r = vl_check
    assert r["torchvision"] in ("cpu-compat", "installed")
    assert r["image_tokens"] == [16, 6] and r["tokens"] == 6
    # vLLM's own image processor and vision tower: the trainer's logprobs of its tokens
    assert r["gap_before_sync"] < 1e-4


@pytest.mark.parametrize("mode,path", [("auto", "inplace"), ("reload", "reload")])
def test_weight_sync_reaches_both_towers(vl_check, mode, path):
    """Every weight perturbed (vision tower and language model), synced in place (the
    checkpoint names mapped to the engine's, a padded vocabulary filled) or through vLLM's
    reload: parity after the sync, the images matter, text requests too."""
    r = vl_check
    assert r[f"sync_path_{mode}"] == path
    assert r[f"gap_after_{mode}_sync"] < 1e-4
    assert r[f"gap_other_pixels_{mode}"] > 1e-2
    assert r[f"gap_text_{mode}"] < 1e-4


def test_bad_image_requests_are_refused_and_the_engine_lives_on(vl_check):
    e = vl_check["errors"]
    assert "placeholder runs of lengths []" in e["missing_placeholders"]
    assert "lengths [6] but the images need [16]" in e["wrong_run_length"]
    assert "images must be ImageInput" in e["not_image_input"]
    assert vl_check["alive_after_errors"] >= 1


def test_a_two_turn_image_rollout_through_vllm(vl_check):
    """Prompt image, a crop from the real image tool, then vLLM: the trainer's batch is
    the engine's last request plus what it sampled, and its logprobs agree."""
    r = vl_check
    assert r["rollout_error"] is None and r["rollout_tool_calls"] == 1
    assert r["rollout_images"] == [["prompt", [1, 8, 8]], ["observation", [1, 4, 4]]]
    assert r["rollout_last_request_images"] == 2 and r["rollout_final_tokens"] >= 1
    assert r["rollout_ids_match"]
    assert r["rollout_gap"] < 1e-4


# ---------------------------------------------------------------- pieces, in this process
@pytest.fixture(scope="module")
def vl_config():
    from support.vision_language import vl_model_config

    return vl_model_config()


def test_engine_prompt_sends_one_token_per_image_at_the_vision_towers_size(vl_config):
    from verltool_jax.models.image_inputs import ImageProcessor
    from verltool_jax.samplers.vllm_sampler import EnginePrompt

    proc = ImageProcessor(vl_config, 64 * 64, min_pixels=8 * 8)
    rng = np.random.default_rng(0)
    ims = [
        proc(rng.integers(0, 256, (20, 36, 3), dtype=np.uint8)),
        proc(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)),
    ]
    ids = [5, 6] + proc.placeholder_ids(ims[0]) + [7] + proc.placeholder_ids(ims[1]) + [8]
    p = EnginePrompt(ids, ims, vl_config.image_token_id).tokens_prompt()
    tok, start, end = (
        vl_config.image_token_id,
        vl_config.vision_start_token_id,
        vl_config.vision_end_token_id,
    )
    assert p["prompt_token_ids"] == [5, 6, start, tok, end, 7, start, tok, end, 8]
    sizes = [im.size for im in p["multi_modal_data"]["image"]]
    patch = vl_config.vision.patch_size
    assert sizes == [(im.grid_thw[2] * patch, im.grid_thw[1] * patch) for im in ims]
    px = [w * h for w, h in sizes]
    assert p["mm_processor_kwargs"] == {"size": {"shortest_edge": min(px), "longest_edge": max(px)}}
    # the resized image cuts the same patches as the original did
    for im, pic in zip(ims, p["multi_modal_data"]["image"]):
        np.testing.assert_array_equal(proc(pic).pixel_values, im.pixel_values)
    assert EnginePrompt([1, 2, 3]).tokens_prompt() == {"prompt_token_ids": [1, 2, 3]}


def test_engine_prompt_check_expansion_names_a_mismatch(vl_config):
    from types import SimpleNamespace

    from verltool_jax.models.image_inputs import ImageProcessor
    from verltool_jax.samplers.base import SamplerError
    from verltool_jax.samplers.vllm_sampler import EnginePrompt

    proc = ImageProcessor(vl_config, 64 * 64, min_pixels=8 * 8)
    im = proc(np.zeros((16, 16, 3), np.uint8))
    ids = [5] + proc.placeholder_ids(im) + [6]
    ep = EnginePrompt(ids, [im], vl_config.image_token_id)
    ep.check_expansion("vl", SimpleNamespace(prompt_token_ids=list(ids)))
    wrong = (
        [5, vl_config.vision_start_token_id]
        + [vl_config.image_token_id] * 9
        + [vl_config.vision_end_token_id, 6]
    )
    with pytest.raises(SamplerError, match=r"placeholder runs \[9\], the trainer to \[4\]"):
        ep.check_expansion("vl", SimpleNamespace(prompt_token_ids=wrong))


def test_a_text_only_model_refuses_images():
    from verltool_jax.models.config import ModelConfig
    from verltool_jax.samplers.validation import check_image_request

    text = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    with pytest.raises(SamplerRequestError, match="text-only and cannot take images"):
        check_image_request("vllm0", text, [1, 2, 3], [object()])


def test_a_remote_server_refuses_images():
    from verltool_jax.samplers.remote_vllm import RemoteVLLMSampler

    s = object.__new__(RemoteVLLMSampler)
    s.name, s._closed = "remote0", False
    with pytest.raises(SamplerRequestError, match="remote vLLM server takes no images"):
        asyncio.run(s.generate([1, 2], SamplingParams(max_tokens=2), images=[object()]))


def test_torchvision_enable_names_the_fix_when_nothing_is_installed(tmp_path):
    import importlib.util

    from verltool_jax.samplers.torchvision_cpu import TorchvisionUnavailableError, enable

    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        assert enable(tmp_path / "none") == "installed"  # a working install is used
        return
    with pytest.raises(TorchvisionUnavailableError, match="run scripts/setup.sh"):
        enable(tmp_path / "none")


def test_the_trainer_knows_a_vision_language_policy(tmp_path):
    """``python -m verltool_jax.train`` prepares torchvision (before transformers is
    imported) for a VL policy: a tiny one of that family, or a checkpoint folder of one."""
    import dataclasses

    from configs.vt_visual import get_config
    from verltool_jax.run_config import run_config_from_dict
    from verltool_jax.samplers.torchvision_cpu import is_vision_language

    rc = run_config_from_dict(get_config("tiny"))
    assert is_vision_language(rc)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    text = dataclasses.replace(
        rc, model=dataclasses.replace(rc.model, family="qwen2", path=str(tmp_path))
    )
    assert is_vision_language(text)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert not is_vision_language(text)


@pytest.mark.slow
def test_the_visual_family_trains_with_the_vllm_sampler(tmp_path):
    """The trainer's own run: vt_visual tiny (head size 32) sampled by vLLM with images, two
    RL steps; the trainer's logprobs of vLLM's tokens agree (its parity metric)."""
    out = tmp_path / "run"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "verltool_jax.train",
            "--config",
            "configs/vt_visual.py:tiny",
            "--config.sampler.backend=vllm",
            "--config.model.tiny.hidden_size=128",
            f"--config.trainer.out_dir={out}",
        ],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "sampler backend: vllm" in r.stdout + r.stderr
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    diffs = [m["sync/logprob_diff_max"] for m in rows if "sync/logprob_diff_max" in m]
    assert diffs and max(diffs) < 1e-4, diffs


def test_torchvision_enable_refuses_after_transformers_was_imported(tmp_path):
    """This session imported transformers long ago: making the ops-free torchvision
    importable now would leave transformers' processor maps without it, so enable() says
    what to do instead of letting vLLM fail later."""
    import importlib.util

    from verltool_jax.samplers.torchvision_cpu import TorchvisionUnavailableError, enable

    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        assert enable(tmp_path) == "installed"
        return
    import transformers  # noqa: F401

    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "__init__.py").write_text("")
    with pytest.raises(TorchvisionUnavailableError, match="imported before torchvision"):
        enable(tmp_path)
    assert str(tmp_path) not in sys.path
