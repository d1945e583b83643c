"""The visual-reasoning family: the Pixel-Reasoner reward terms, the easy_vqa task rows
(verl multimodal layout, held-out images), and configs/vt_visual.py."""

from __future__ import annotations

import pytest

from verltool_jax.rewards import get_reward_fn, resolve_reward_name
from verltool_jax.rewards.visual_reward import (
    CuriositySettings,
    add_curiosity_terms,
    curiosity_settings,
    curiosity_terms,
    group_scores,
    visual_answer,
)


def test_visual_answer_reward():
    fn = get_reward_fn(resolve_reward_name("easy_vqa"))
    assert fn("<tool_call>..</tool_call> <answer> Circle. </answer>", "circle", {}).correct
    assert fn("\\boxed{RED}", ["red"], {}).score == 1.0
    r = fn("I think it is blue", "blue", {})
    assert not r.correct and r.info["has_answer"] is False
    assert visual_answer("<answer>no</answer>") == "no"


def test_curiosity_bonus_and_redundancy_penalty():
    # group of 4, one uses the tool once: rate 0.25 < H = 0.3 -> bonus 0.5 * 0.05 = 0.025
    assert curiosity_terms([1, 0, 0, 0]) == [(pytest.approx(0.025), 0.0)] + [(0.0, 0)] * 3
    # rate 0.5 >= H: no bonus; 3 calls: 2 beyond the free one -> -0.1
    terms = curiosity_terms([3, 1, 0, 0])
    assert terms[0] == (0.0, pytest.approx(-0.1)) and terms[1] == (0.0, 0)
    assert group_scores([True, False, True, False], [3, 1, 0, 0]) == pytest.approx(
        [0.9, 0.0, 1.0, 0.0]
    )
    s = CuriositySettings(rate_bound=1.0, alpha=1.0, free_calls=0, beta=0.5)
    assert group_scores([False, False], [1, 0], s) == pytest.approx([0.5 - 0.5, 0.0])
    with pytest.raises(ValueError, match="correct has 1 entries"):
        group_scores([True], [0, 1])


def test_curiosity_terms_are_added_per_group_to_scored_trajectories():
    from types import SimpleNamespace as T

    g1 = [
        T(reward=1.0, reward_info={"acc": 1.0}, tool_calls=3, invalid_tool_calls=1),
        T(reward=0.0, reward_info={}, tool_calls=0, invalid_tool_calls=0),
        T(reward=0.0, reward_info={}, tool_calls=0, invalid_tool_calls=0),
        T(reward=None, reward_info={}, tool_calls=5, invalid_tool_calls=0),
    ]  # failed
    g2 = [
        T(reward=1.0, reward_info={}, tool_calls=1, invalid_tool_calls=0),
        T(reward=0.0, reward_info={}, tool_calls=1, invalid_tool_calls=1),
    ]
    m = add_curiosity_terms([g1, g2])
    # g1: valid calls [2, 0, 0] (the failed one left out), rate 1/3 > 0.3: no bonus;
    # 2 calls cost 0.05 for the one beyond the first
    assert [t.reward for t in g1[:3]] == pytest.approx([1.0 - 0.05, 0.0, 0.0])
    assert g1[3].reward is None and "curiosity_bonus" not in g1[3].reward_info
    assert g1[0].reward_info == {
        "acc": 1.0,
        "curiosity_bonus": 0.0,
        "extra_call_penalty": pytest.approx(-0.05),
    }
    # g2: valid calls [1, 0], rate 0.5: no bonus either; with a bound of 0.6 there is
    assert [t.reward for t in g2] == pytest.approx([1.0, 0.0])
    assert m == {
        "reward/curiosity_bonus": 0.0,
        "reward/extra_call_penalty": pytest.approx(-0.05 / 5),
    }
    g3 = [
        T(reward=0.0, reward_info={}, tool_calls=1, invalid_tool_calls=0),
        T(reward=0.0, reward_info={}, tool_calls=0, invalid_tool_calls=0),
    ]
    add_curiosity_terms([g3], CuriositySettings(rate_bound=0.6))
    assert [t.reward for t in g3] == pytest.approx([0.5 * 0.1, 0.0])


def test_easy_vqa_rows_and_config(tmp_path):
    pytest.importorskip("easy_vqa")
    from verltool_jax.data.readers import read_files
    from verltool_jax.models.image_inputs import decode_image
    from verltool_jax.tasks import task_config
    from verltool_jax.tasks.easy_vqa import all_answers, demonstration_actions, write_task

    files = write_task(tmp_path, num_train=20, num_eval=10, num_demos=5, seed=0)
    train, evals = read_files([files.train]), read_files([files.eval])
    demos = read_files([tmp_path / "demos.parquet"])
    assert len(train) == 20 and len(evals) == 10 and len(demos) == 5 and files.sft is None
    answers = set(all_answers())
    assert len(answers) == 13
    for r in train + evals:
        assert r["prompt"][1]["content"].startswith("<image>") and len(r["images"]) == 1
        assert r["extra_info"]["images"] == list(r["images"])
        assert r["reward_model"]["ground_truth"] in answers
    assert decode_image(train[0]["images"][0]).size == (64, 64)
    assert not {r["images"][0] for r in train} & {r["images"][0] for r in evals}
    acts = demonstration_actions(train[0])
    assert acts[0].startswith('<tool_call>{"name": "zoom_in"') and acts[1].startswith("<answer>")
    assert task_config({"name": "easy_vqa", "num_train": 3}).num_train == 3

    from configs.base import get_config as base_config
    from configs.vt_visual import get_config
    from verltool_jax.run_config import run_config_from_dict

    tiny, paper = (
        run_config_from_dict(get_config("tiny")),
        run_config_from_dict(get_config("paper")),
    )
    assert tiny.model.family == paper.model.family == "qwen2_5_vl"
    assert paper.model.path == "Qwen/Qwen2.5-VL-7B-Instruct" and paper.rollout.n_samples == 8
    assert paper.trainer.batch_groups == 128 and paper.rollout.max_turns == 3
    assert tiny.tool_server.tools == ("image",) and tiny.reward.name == "visual_answer"
    assert (
        curiosity_settings(tiny.reward) == curiosity_settings(paper.reward) == CuriositySettings()
    )
    assert curiosity_settings(run_config_from_dict(base_config()).reward) is None
    assert run_config_from_dict(get_config("tiny")).sampler.backend == "jax"
    assert paper.sampler.backend == "auto"
    with pytest.raises(ValueError, match="unknown variant"):
        get_config("huge")
