"""``python tests/support/slow_tool_trainer.py <train arguments>``: ``python -m
verltool_jax.train`` whose sampler is a :class:`ScriptedSampler` that answers every first
turn with a Python call sleeping ``SLOW_TOOL_S`` (60) seconds, so the run is always in the
middle of a tool call (the orphan test kills it then)."""

from __future__ import annotations

import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# this repository first (not an installed copy), then tests/ for ``support``; never
# tests/support itself (its tool_server.py would hide the package)
sys.path[0:1] = [os.path.dirname(_TESTS), _TESTS]

from support.scripted_sampler import ScriptedSampler  # noqa: E402
from verltool_jax.train import build  # noqa: E402
from verltool_jax.train.__main__ import main  # noqa: E402

SLEEP_S = int(os.environ.get("SLOW_TOOL_S", "60"))


def make_sampler(rc, model_dir, *, trainer_overlaps=None, adapters=True):
    tok = build.load_tokenizer(rc, model_dir)

    def script(rid: str, turn: int) -> str:
        if turn == 0:
            return f"<python>import time\ntime.sleep({SLEEP_S})\nprint(1)</python>"
        return "<answer>1</answer>"

    return ScriptedSampler(tok, script, delay_s=0.01)


if __name__ == "__main__":
    build.make_sampler = make_sampler
    sys.exit(main())
