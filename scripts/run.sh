#!/usr/bin/env bash
# The main job in one command on a fresh machine: set up (if not done yet), then train
# the tiny model to use a Python tool (configs/tiny_math.py, a few minutes on 2 CPU cores).
# Extra arguments go to the trainer, e.g. `bash scripts/run.sh --config.trainer.steps=80`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m verltool_jax.train --config configs/tiny_math.py "$@"
