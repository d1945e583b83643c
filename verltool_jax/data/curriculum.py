"""A difficulty curriculum over labelled prompts: each group (a dataset) has a current
level that rises when its recent pass rate is high and falls when it is low.

Rows carry ``extra_info["difficulty"] = {"group": name, "level": L}`` (the reasoning_gym
task writes them). :class:`CurriculumPrompts` hands out prompts like a
:class:`~verltool_jax.data.pipeline.PromptPipeline` (same protocol: iteration,
``consumed``, ``example_at``, ``get_state`` / ``set_state``): draw ``k`` picks a group
with probability proportional to its number of rows (so the data's mixture is the
sampling mixture), then the next row of that group's pool at the group's current level
(the nearest level below with rows, else above, when that pool is empty), each pool
cycling through its own seeded permutation.

:class:`Curriculum` is the rule, a pure state machine: after a training step,
:meth:`Curriculum.observe` takes the pass rate (mean correctness) of each scored prompt
group that was drawn at its group's *current* level, keeps the last ``window`` of them per
group, and when the window is full compares their mean ``m`` with the thresholds::

    m >= raise_above and level < top   ->  level + 1, window cleared
    m <= lower_below and level > min   ->  level - 1, window cleared

Levels, windows, pool positions and the draw count are the saved state, so a resumed run
continues exactly where the checkpoint was taken. The settings are the ``curriculum``
config section (:class:`verltool_jax.run_config.CurriculumSection`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def difficulty_of(row: dict) -> tuple[str, int] | None:
    """``(group, level)`` of a labelled row, else None."""
    d = (row.get("extra_info") or {}).get("difficulty")
    if not isinstance(d, dict) or "group" not in d or "level" not in d:
        return None
    return str(d["group"]), int(d["level"])


class Curriculum:
    """Per-group levels moved by rolling pass rates (the rule of the module doc)."""

    def __init__(self, levels: Mapping[str, Sequence[int]], settings: Any):
        if not levels:
            raise ValueError("curriculum: no group has labelled rows")
        self.settings = settings
        self.available = {g: sorted(set(lv)) for g, lv in levels.items()}
        self.level = {g: self._clamp(g, settings.start_level) for g in self.available}
        self.window: dict[str, list[float]] = {g: [] for g in self.available}
        self.moves: dict[str, int] = {g: 0 for g in self.available}

    def _clamp(self, group: str, level: int) -> int:
        lv = self.available[group]
        return max(lv[0], min(lv[-1], max(self.settings.min_level, level)))

    def observe(self, results: Sequence[tuple[str, int, float]]) -> dict[str, str]:
        """Take ``(group, level drawn at, pass rate)`` per scored prompt group; returns
        the groups whose level moved this time, ``{group: "up"|"down"}``."""
        s = self.settings
        moved = {}
        for group, level, rate in results:
            if group not in self.level or level != self.level[group]:
                continue  # drawn at an older level (async rollout), or not ours
            w = self.window[group]
            w.append(float(rate))
            del w[: -s.window]
            if len(w) < s.window:
                continue
            m = sum(w) / len(w)
            lv = self.available[group]
            top, bottom = lv[-1], max(lv[0], s.min_level)
            if m >= s.raise_above and self.level[group] < top:
                self.level[group] = min(x for x in lv if x > self.level[group])
                moved[group] = "up"
            elif m <= s.lower_below and self.level[group] > bottom:
                self.level[group] = max(x for x in lv if x < self.level[group])
                moved[group] = "down"
            else:
                continue
            self.window[group] = []
            self.moves[group] += 1
        return moved

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for g in sorted(self.level):
            out[f"curriculum/{g}/level"] = float(self.level[g])
            w = self.window[g]
            if w:
                out[f"curriculum/{g}/pass_rate"] = sum(w) / len(w)
        return out

    def get_state(self) -> dict:
        return {
            "level": dict(self.level),
            "window": {g: list(w) for g, w in self.window.items()},
            "moves": dict(self.moves),
        }

    def set_state(self, state: dict) -> None:
        unknown = set(state.get("level", {})) - set(self.level)
        if unknown:
            raise ValueError(
                f"cannot resume the curriculum: groups {sorted(unknown)} are not "
                f"in the data (groups now: {sorted(self.level)})"
            )
        self.level.update({g: int(v) for g, v in state["level"].items()})
        self.window.update({g: [float(x) for x in w] for g, w in state["window"].items()})
        self.moves.update({g: int(v) for g, v in state.get("moves", {}).items()})


class CurriculumPrompts:
    """Prompts drawn per group at the group's current level (see the module doc).

    ``transform(index, row)`` makes the example (``None`` skips the row, e.g. a prompt over
    the token budget), as in :class:`~verltool_jax.data.pipeline.PromptPipeline`."""

    def __init__(
        self,
        rows: Sequence[dict],
        transform: Callable[[int, dict], Any],
        settings: Any,
        seed: int = 0,
    ):
        self.rows = list(rows)
        self._transform = transform
        self.seed = int(seed)
        self.pools: dict[tuple[str, int], list[int]] = {}
        for i, row in enumerate(self.rows):
            label = difficulty_of(row)
            if label is None:
                raise ValueError(
                    f"curriculum.enabled: row {i} has no extra_info.difficulty "
                    "({'group': ..., 'level': ...}); the reasoning_gym task writes it, or set "
                    "curriculum.enabled=false"
                )
            self.pools.setdefault(label, []).append(i)
        levels: dict[str, list[int]] = {}
        for g, lv in self.pools:
            levels.setdefault(g, []).append(lv)
        self.curriculum = Curriculum(levels, settings)
        self.groups = sorted(levels)
        self.weights = [sum(len(self.pools[(g, lv)]) for lv in levels[g]) for g in self.groups]
        self.cursor = {k: 0 for k in self.pools}
        self.consumed = 0

    # ------------------------------------------------------------------ drawing
    def _pool(self, group: str) -> tuple[str, int]:
        level = self.curriculum.level[group]
        lv = self.curriculum.available[group]
        below = [x for x in lv if x <= level]
        return (group, max(below) if below else min(lv))

    def _order(self, key: tuple[str, int], epoch: int) -> list[int]:
        order = list(self.pools[key])
        random.Random(f"{self.seed}/{key[0]}/{key[1]}/{epoch}").shuffle(order)
        return order

    def _draw(self) -> int:
        rng = random.Random(f"{self.seed}/draw/{self.consumed}")
        group = rng.choices(self.groups, weights=self.weights)[0]
        key = self._pool(group)
        n = len(self.pools[key])
        c = self.cursor[key]
        self.cursor[key] = c + 1
        return self._order(key, c // n)[c % n]

    def __iter__(self):
        return self

    def __next__(self):
        for _ in range(max(16, 4 * len(self.rows))):
            index = self._draw()
            self.consumed += 1
            ex = self._transform(index, self.rows[index])
            if ex is not None:
                return ex
        raise ValueError("curriculum: no row of the current levels fits the prompt budget")

    def example_at(self, index: int):
        if not 0 <= index < len(self.rows):
            raise IndexError(f"row index {index} out of range (0..{len(self.rows) - 1})")
        return self._transform(int(index), self.rows[int(index)])

    # ------------------------------------------------------------------ feedback
    def observe(self, groups: Sequence[Sequence[Any]]) -> dict[str, float]:
        """The pass rate of each scored prompt group (trajectories with ``data`` rows and
        ``reward_info["acc"]``) moves the levels; returns the curriculum metrics."""
        results = []
        for g in groups:
            if not g:
                continue
            label = difficulty_of(g[0].data or {})
            if label is None:
                continue
            rate = sum(float(t.reward_info.get("acc", 0.0)) for t in g) / len(g)
            results.append((label[0], label[1], rate))
        self.curriculum.observe(results)
        return self.curriculum.metrics()

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict:
        return {
            "consumed": self.consumed,
            "seed": self.seed,
            "num_rows": len(self.rows),
            "cursor": [[g, lv, c] for (g, lv), c in sorted(self.cursor.items())],
            "curriculum": self.curriculum.get_state(),
        }

    def set_state(self, state: dict) -> None:
        if state.get("num_rows") != len(self.rows) or state.get("seed") != self.seed:
            raise ValueError(
                "cannot resume the curriculum prompts: the saved state was taken on other "
                f"data or seed (rows {state.get('num_rows')} vs {len(self.rows)}, seed "
                f"{state.get('seed')} vs {self.seed})"
            )
        self.consumed = int(state["consumed"])
        for g, lv, c in state["cursor"]:
            if (g, lv) in self.cursor:
                self.cursor[(g, lv)] = int(c)
        self.curriculum.set_state(state["curriculum"])
