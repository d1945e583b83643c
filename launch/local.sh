#!/usr/bin/env bash
# A local sweep over a config family (big_vision style): one run per get_config(arg).
#
#   launch/local.sh [--dry-run] CONFIG [ARG ...] [-- OVERRIDE ...]
#
#   launch/local.sh configs/tiny_math.py "" sync                  # async vs sync ablation
#   launch/local.sh configs/tiny_math.py smoke -- --config.trainer.steps=3
#
# Each ARG runs `python -m verltool_jax.train --config CONFIG:ARG OVERRIDES...` in turn,
# into runs/<config>_<arg>/ unless an override sets --config.trainer.out_dir. An empty
# ARG ("") is the config's default. --dry-run (or DRY_RUN=1) prints the commands only.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || { [ -f .venv/bin/activate ] && . .venv/bin/activate; }

[ "${1:-}" = "--dry-run" ] && { DRY_RUN=1; shift; }
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
config="$1"; shift
args=(); overrides=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; overrides=("$@"); break; fi
  args+=("$1"); shift
done
[ ${#args[@]} -gt 0 ] || args=("")

# CPU defaults (harmless on accelerators): vLLM's CPU backend, offline Hugging Face.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"

echo "## env VLLM_CPU_KVCACHE_SPACE=$VLLM_CPU_KVCACHE_SPACE VLLM_ENABLE_V1_MULTIPROCESSING=$VLLM_ENABLE_V1_MULTIPROCESSING TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=$HF_HUB_OFFLINE"
name="$(basename "$config" .py)"
for arg in "${args[@]}"; do
  spec="$config${arg:+:$arg}"
  out="runs/${name}${arg:+_${arg//,/_}}"
  cmd=(python -m verltool_jax.train --config "$spec" "--config.trainer.out_dir=$out" "${overrides[@]}")
  # The last out_dir override wins (as in the trainer), and console.log goes there too.
  for o in "${overrides[@]}"; do
    case "$o" in --config.trainer.out_dir=*) out="${o#--config.trainer.out_dir=}" ;; esac
  done
  echo "== ${cmd[*]}"
  if [ "${DRY_RUN:-0}" != 1 ]; then
    mkdir -p "$out"
    "${cmd[@]}" 2>&1 | tee "$out/console.log"
  fi
done
