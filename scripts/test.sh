#!/usr/bin/env bash
# The default test run (README): every component for real, at a small size. Sets up
# first if needed (scripts/setup.sh is idempotent). `bash scripts/test.sh -m slow` runs
# the slow tests; other arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
. .venv/bin/activate
export XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=8}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0
export TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1
python -m pytest -m "not slow" -q --timeout=900 "$@"
rc=$?
[ $rc -eq 5 ] && { echo "no tests collected"; exit 1; }
exit $rc
