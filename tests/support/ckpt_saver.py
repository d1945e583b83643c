"""``python tests/support/ckpt_saver.py DIR``: resume from the latest checkpoint in DIR,
check that it is exactly one saved state, then save steps after it without pause (the
crash-consistency test kills this process at random moments).

Every array of the state saved at step s is filled with s and its data state is
``{"pos": s}``, so a restored mixture of two saves, or a partly written one, shows. Prints
one JSON line, ``{"rejected": [...], "resumed": s or null, "bad": reason or null}``, then
``saving s`` before each save.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

if __name__ == "__main__":  # this repository first, not an installed copy
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from verltool_jax.train.checkpoint import Checkpointer

SHAPES = {"w1": (1024, 1024), "w2": (1024, 512), "b": (4096,)}


@dataclass(frozen=True)
class State:
    """The fields of a TrainState that a Checkpointer saves."""

    params: Any
    opt_state: Any
    step: Any
    rng: Any
    ref_params: Any = None
    value_params: Any = None  # the critic's (PPO with GAE); None without one
    value_opt_state: Any = None

    def replace(self, **kw):
        return replace(self, **kw)


def state_at(step: int) -> State:
    params = {k: np.full(s, step, np.float32) for k, s in SHAPES.items()}
    return State(
        params,
        {"mu": np.full((1024, 256), step, np.float32)},
        np.asarray(step, np.int32),
        np.full((2,), step, np.uint32),
    )


def check(state: State, data: dict, step: int) -> str | None:
    if int(state.step) != step or data != {"pos": step}:
        return f"step {int(state.step)} with data {data} in checkpoint step {step}"
    for leaf in [*state.params.values(), *state.opt_state.values(), state.rng]:
        if not np.all(np.asarray(leaf) == step):
            return f"checkpoint step {step} holds values of other steps"
    return None


def main(directory: str) -> None:
    ck = Checkpointer(directory, save_every=1, keep=2)
    latest = ck.latest_step()
    bad = None
    if latest is not None:
        state, data = ck.restore(state_at(0))
        bad = check(state, data, latest)
    print(
        json.dumps(
            {"rejected": [r.describe() for r in ck.rejected], "resumed": latest, "bad": bad}
        ),
        flush=True,
    )
    step = (latest or 0) + 1
    while True:
        print(f"saving {step}", flush=True)
        ck.maybe_save(state_at(step), {"pos": step})
        step += 1


if __name__ == "__main__":
    main(sys.argv[1])
