"""The reasoning_gym task: levels from reasoning-gym's curricula, disjoint train and
held-out items, the dataset's own scorer as the reward, demonstration programs run by the
real tool server, and a rollout end to end (prompt -> python call -> observation ->
answer -> scorer reward) through the sandboxed python tool."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from verltool_jax.rewards import reasoning_gym_reward as rgr
from verltool_jax.tasks import reasoning_gym as T

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
ALL = (
    "gsm_symbolic",
    "basic_arithmetic",
    "chain_sum",
    "products",
    "decimal_arithmetic",
    "time_intervals",
    "calendar_arithmetic",
    "leg_counting",
)


def test_levels_are_reasoning_gyms_curricula_in_upper_bound_mode():
    assert rgr.level_settings("chain_sum", 2) == {
        "min_terms": 4,
        "max_terms": 4,
        "min_digits": 3,
        "max_digits": 3,
    }
    # an attribute with fewer levels stays at its last one
    assert rgr.level_settings("basic_arithmetic", 9)["max_digits"] == 4
    assert rgr.num_levels("gsm_symbolic") == 1 and rgr.level_settings("gsm_symbolic", 3) == {}
    _, items = T.generate_items("chain_sum", 2, 5, seed=1, options={})
    assert all(e["metadata"]["num_terms"] == 4 and e["metadata"]["num_digits"] == 3 for e in items)
    with pytest.raises(ValueError, match="did you mean 'chain_sum'"):
        rgr.make_dataset("chain_sums", {}, 0, 1)


def test_reward_is_the_datasets_scorer():
    settings, (e,) = T.generate_items(
        "time_intervals", 3, 1, seed=5, options={"time_intervals": {"task_types": ["time_seconds"]}}
    )
    gt = rgr.ground_truth("time_intervals", settings, e)
    right = rgr.reasoning_gym_reward(f"<answer>{e['answer']}</answer>", gt, {})
    assert right.score == 1.0 and right.correct
    h, m, s = (int(x) for x in e["answer"].split(":"))
    near = f"{h:02d}:{m:02d}:{(s + 1) % 60:02d}" if s < 59 else f"{h:02d}:{m:02d}:58"
    close = rgr.reasoning_gym_reward(f"<answer>{near}</answer>", gt, {})
    assert 0.9 < close.score < 1.0 and not close.correct  # partial credit is not a pass
    none = rgr.reasoning_gym_reward("the answer is 3", gt, {})
    assert none.score == 0.0 and none.info["has_answer"] is False


def test_files_levels_and_disjoint_held_out(tmp_path):
    t = T.ReasoningGymTask(
        datasets=("chain_sum", "leg_counting"),
        train_levels=(0, 1),
        eval_levels=(0, 2),
        num_train=6,
        num_eval=3,
        num_demos=0,
        math_eval_files=("gsm8k/test.jsonl",),
        math_eval_size=4,
        data_dir=str(DATA),
    )
    if not (DATA / "gsm8k" / "test.jsonl").is_file():
        t = T.ReasoningGymTask(**{**t.__dict__, "math_eval_files": ()})
    files = T.write_task(t, tmp_path)
    from verltool_jax.data.readers import read_raw

    train = read_raw(files.train)
    assert len(train) == 2 * 2 * 6
    labels = {(r["extra_info"]["dataset"], r["extra_info"]["level"]) for r in train}
    assert labels == {(d, lv) for d in t.datasets for lv in (0, 1)}
    assert all(
        r["extra_info"]["difficulty"]
        == {"group": r["extra_info"]["dataset"], "level": r["extra_info"]["level"]}
        for r in train
    )
    assert sorted(r["extra_info"]["index"] for r in train) == list(range(len(train)))
    evals = [read_raw(p) for p in files.eval]
    assert [Path(p).name for p in files.eval][:2] == ["eval_level0.parquet", "eval_level2.parquet"]
    assert {r["extra_info"]["set"] for r in evals[0]} == {"rg_level0"}
    questions = {r["prompt"][-1]["content"] for r in train}
    held = [r for rows in evals[:2] for r in rows]
    assert len(held) == 2 * 2 * 3 and not questions & {r["prompt"][-1]["content"] for r in held}
    if t.math_eval_files:
        assert len(evals[2]) == 4 and evals[2][0]["data_source"] == "gsm8k"
    # the system prompt tells the python tool's syntax and the answer format
    sys_prompt = train[0]["prompt"][0]["content"]
    assert "<python>" in sys_prompt and "<answer>" in sys_prompt


def test_bad_settings_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="task.options is not valid JSON"):
        T.write_task(T.ReasoningGymTask(options="{oops"), tmp_path)
    with pytest.raises(ValueError, match="task.datasets is empty"):
        T.write_task(T.ReasoningGymTask(datasets=()), tmp_path)
    with pytest.raises(ValueError, match="refused the settings"):
        T.write_task(
            T.ReasoningGymTask(
                datasets=("chain_sum",), options='{"chain_sum": {"no_such_field": 1}}'
            ),
            tmp_path,
        )


def _rows(datasets, level=0, n=3, seed=11):
    out = []
    for d in datasets:
        settings, items = T.generate_items(d, level, n, T.item_seed(seed, d, level, "train"), {})
        out += [
            T.make_row(d, level, settings, e, len(out) + i, "train") for i, e in enumerate(items)
        ]
    return out


def test_demonstrations_of_every_dataset_pass_the_real_tool_server(tool_url):
    from verltool_jax.run_config import RunConfig, ToolServerSection

    rc = RunConfig(tool_server=ToolServerSection(url=tool_url))
    rows = _rows(ALL, n=6)
    t = T.ReasoningGymTask(datasets=ALL, num_demos=2, demo_levels=(0,))
    demos = T.demonstrations(t, rows, rc)
    got = {}
    for d in demos:
        got[d["extra_info"]["dataset"]] = got.get(d["extra_info"]["dataset"], 0) + 1
        action, obs, final = d["response_segments"]
        assert action["text"].startswith("<python>") and obs["loss"] is False
        answer = re.fullmatch(r"<answer>(.*)</answer>", final["text"]).group(1)
        assert rgr.score(answer, d["reward_model"]["ground_truth"]) == 1.0
    assert set(got) == set(ALL) and all(n <= 2 for n in got.values())


def test_rollout_end_to_end_through_the_sandboxed_tool(tool_url, tok):
    """Scripted policy: the demonstration program, then the answer it printed (or a wrong
    one); the real tool server runs the code, the reward pool scores with the scorer."""
    from support.scripted_sampler import ScriptedSampler

    from tool_server.client import ToolClient
    from verltool_jax.data.pipeline import _prompt_transform
    from verltool_jax.rewards.compute import RewardPool
    from verltool_jax.rollout.config import RolloutConfig
    from verltool_jax.train.evaluate import prompt_item, rollout_scored

    rows = _rows(("products", "leg_counting", "calendar_arithmetic"), n=2)
    programs = [
        T.PROGRAMS[json.loads(r["reward_model"]["ground_truth"])["dataset"]](
            json.loads(r["reward_model"]["ground_truth"])["entry"]
        )
        for r in rows
    ]
    answers = [json.loads(r["reward_model"]["ground_truth"])["entry"]["answer"] for r in rows]
    transform = _prompt_transform(tok, None, "drop")
    items = [prompt_item(transform(i, r), "rg") for i, r in enumerate(rows)]

    def script(rid, turn):
        i = int(re.match(r"rg(\d+)", rid).group(1))
        if turn == 0:
            return f"Let me compute.<python>\n{programs[i]}\n</python>"
        return f"<answer>{answers[i] if i % 2 == 0 else 'wrong'}</answer>"

    cfg = RolloutConfig(
        max_turns=2,
        max_response_tokens=2048,
        max_obs_tokens=256,
        action_stop_strings=("</python>",),
        final_stop_strings=("</answer>",),
    )

    async def go():
        async with ToolClient(tool_url, timeout_s=60) as client:
            with RewardPool(num_workers=0) as pool:
                return await rollout_scored(
                    ScriptedSampler(tok, script), items, client, tok, cfg, pool
                )

    groups = asyncio.run(go())
    for i, (t,) in enumerate(groups):
        assert t.tool_calls == 1 and t.invalid_tool_calls == 0
        assert answers[i] in t.observations[0]  # the sandbox printed the right value
        assert t.reward == (1.0 if i % 2 == 0 else 0.0)
        assert t.reward_info["acc"] == (1.0 if i % 2 == 0 else 0.0)
