"""The difficulty curriculum: levels move up and down on scripted pass rates, prompts come
from the current level's pool, and the state survives a resume exactly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from verltool_jax.data.curriculum import Curriculum, CurriculumPrompts
from verltool_jax.run_config import CurriculumSection

S = CurriculumSection(enabled=True, window=3, raise_above=0.75, lower_below=0.25)


def rows(groups=("a", "b"), levels=(0, 1, 2), per=5):
    out = []
    for g in groups:
        for lv in levels:
            for i in range(per):
                out.append(
                    {
                        "prompt": f"{g}{lv}-{i}",
                        "extra_info": {"difficulty": {"group": g, "level": lv}},
                    }
                )
    return out


def example(index, row):
    return SimpleNamespace(index=index, row=row)


def scored(group, level, rate, n=4):
    wins = round(rate * n)
    row = {"extra_info": {"difficulty": {"group": group, "level": level}}}
    return [SimpleNamespace(data=row, reward_info={"acc": float(i < wins)}) for i in range(n)]


def test_levels_rise_and_fall_on_the_rolling_pass_rate():
    c = Curriculum({"a": [0, 1, 2], "b": [0, 1, 2]}, S)
    assert c.observe([("a", 0, 1.0), ("a", 0, 1.0)]) == {}  # window not full yet
    assert c.observe([("a", 0, 0.75)]) == {"a": "up"} and c.level == {"a": 1, "b": 0}
    assert c.window["a"] == []  # cleared on a move
    assert c.observe([("a", 0, 1.0)] * 3) == {}  # drawn at the old level: ignored
    assert c.observe([("a", 1, 0.5)] * 3) == {}  # between the thresholds: stays
    assert c.observe([("a", 1, 0.0)] * 3) == {"a": "down"} and c.level["a"] == 0
    assert c.observe([("a", 0, 0.0)] * 3) == {}  # already at the bottom
    for _ in range(5):
        c.observe([("b", c.level["b"], 1.0)] * 3)
    assert c.level["b"] == 2  # clamped at the top level of the data
    assert c.metrics()["curriculum/b/level"] == 2.0


def test_min_and_start_levels_and_thresholds_are_checked():
    c = Curriculum({"a": [0, 1, 2]}, CurriculumSection(start_level=5, min_level=1))
    assert c.level["a"] == 2
    c = Curriculum({"a": [0, 1, 2]}, CurriculumSection(start_level=0, min_level=1, window=1))
    assert c.level["a"] == 1
    assert c.observe([("a", 1, 0.0)]) == {}  # min_level holds it
    with pytest.raises(ValueError, match="lower_below"):
        CurriculumSection(raise_above=0.3, lower_below=0.5)


def test_prompts_come_from_the_current_level_and_follow_moves():
    p = CurriculumPrompts(rows(), example, S, seed=3)
    first = [next(p) for _ in range(20)]
    assert {e.row["extra_info"]["difficulty"]["level"] for e in first} == {0}
    assert {e.row["extra_info"]["difficulty"]["group"] for e in first} == {"a", "b"}
    m = p.observe([scored("a", 0, 1.0)] * 3 + [scored("b", 0, 0.5)] * 3)
    assert m["curriculum/a/level"] == 1.0 and m["curriculum/b/level"] == 0.0
    nxt = [next(p).row["extra_info"]["difficulty"] for _ in range(30)]
    assert {d["level"] for d in nxt if d["group"] == "a"} == {1}
    assert {d["level"] for d in nxt if d["group"] == "b"} == {0}


def test_each_pool_cycles_through_all_its_rows():
    p = CurriculumPrompts(rows(groups=("a",), levels=(0,), per=5), example, S)
    seen = [next(p).index for _ in range(10)]
    assert sorted(seen[:5]) == sorted(seen[5:]) == [0, 1, 2, 3, 4]


def test_state_resumes_exactly():
    a = CurriculumPrompts(rows(), example, S, seed=7)
    for _ in range(7):
        next(a)
    a.observe([scored("a", 0, 1.0)] * 3 + [scored("b", 0, 0.9)])
    state = a.get_state()
    b = CurriculumPrompts(rows(), example, S, seed=7)
    b.set_state(state)
    assert [next(a).index for _ in range(25)] == [next(b).index for _ in range(25)]
    assert b.curriculum.level == a.curriculum.level and b.curriculum.window == a.curriculum.window
    with pytest.raises(ValueError, match="other data or seed"):
        CurriculumPrompts(rows(per=4), example, S, seed=7).set_state(state)


def test_unlabelled_rows_are_refused_clearly():
    with pytest.raises(ValueError, match="extra_info.difficulty"):
        CurriculumPrompts([{"prompt": "x", "extra_info": {}}], example, S)


def test_prompts_over_budget_are_skipped():
    def transform(index, row):
        return None if row["extra_info"]["difficulty"]["group"] == "a" else example(index, row)

    p = CurriculumPrompts(rows(), transform, S)
    assert {next(p).row["extra_info"]["difficulty"]["group"] for _ in range(10)} == {"b"}
