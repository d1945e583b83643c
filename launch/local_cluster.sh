#!/usr/bin/env bash
# One host, several processes: tool-server replicas, vLLM servers and the trainer.
#
#   launch/local_cluster.sh [--dry-run] CONFIG[:ARG] [OVERRIDE ...]
#
# Starts TOOL_REPLICAS tool servers and VLLM_SERVERS vLLM OpenAI-compatible servers on
# this host, waits for each one's /health, runs the trainer with
# tool_server.url = every replica (comma-separated) and, when VLLM_SERVERS > 0,
# placement.mode=remote + placement.sampler_urls = every vLLM server; stops them all
# when the trainer exits (also on errors / Ctrl-C). Environment (defaults in brackets):
#   TOOL_REPLICAS [2]  TOOL_PORT [30888] (replica i: TOOL_PORT+i)  TOOLS [python_code]
#   VLLM_SERVERS [0]   VLLM_PORT [8100] (server i: VLLM_PORT+i)    MODEL (HF checkpoint,
#                      needed when VLLM_SERVERS > 0; pass the same --config.model.path)
#   VLLM_MAX_MODEL_LEN [2048]  OUT [runs/local_cluster]: logs of every process
# --dry-run prints every command (with its environment) and starts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || { [ -f .venv/bin/activate ] && . .venv/bin/activate; }
dry=0
[ "${1:-}" = "--dry-run" ] && { dry=1; shift; }
[ $# -ge 1 ] || { sed -n '2,17p' "$0"; exit 2; }
spec="$1"; shift

TOOL_REPLICAS="${TOOL_REPLICAS:-2}"; TOOL_PORT="${TOOL_PORT:-30888}"; TOOLS="${TOOLS:-python_code}"
VLLM_SERVERS="${VLLM_SERVERS:-0}"; VLLM_PORT="${VLLM_PORT:-8100}"
VLLM_MAX_MODEL_LEN="${VLLM_MAX_MODEL_LEN:-2048}"; OUT="${OUT:-runs/local_cluster}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ "$VLLM_SERVERS" -eq 0 ] || [ -n "${MODEL:-}" ] || { echo "VLLM_SERVERS>0 needs MODEL=<HF checkpoint dir>" >&2; exit 2; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

run_bg() {  # run_bg LOG CMD...: start CMD in the background (or print it)
  local log="$1"; shift
  echo "== $* > $log &"
  [ $dry = 1 ] && return 0
  "$@" > "$log" 2>&1 &
  pids+=($!)
}
wait_health() {
  echo "== wait for $1/health"
  [ $dry = 1 ] && return 0
  for _ in $(seq 1200); do curl -sf "$1/health" > /dev/null && return 0; sleep 0.5; done
  echo "$1 did not become healthy; see $OUT" >&2; exit 1
}

echo "## env VLLM_CPU_KVCACHE_SPACE=$VLLM_CPU_KVCACHE_SPACE TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=$HF_HUB_OFFLINE PYTHONPATH=$PYTHONPATH"
[ $dry = 1 ] || mkdir -p "$OUT"
tool_urls=(); vllm_urls=()
for ((i = 0; i < TOOL_REPLICAS; i++)); do
  port=$((TOOL_PORT + i))
  run_bg "$OUT/tool_server_$i.log" python -m tool_server --host 127.0.0.1 --port "$port" --tools "$TOOLS"
  tool_urls+=("http://127.0.0.1:$port")
done
for ((i = 0; i < VLLM_SERVERS; i++)); do
  port=$((VLLM_PORT + i))
  run_bg "$OUT/vllm_server_$i.log" python -m verltool_jax.samplers.remote_vllm "$MODEL" \
    --port "$port" --max-model-len "$VLLM_MAX_MODEL_LEN" --seed "$i"
  vllm_urls+=("http://127.0.0.1:$port")
done
for u in "${tool_urls[@]}" "${vllm_urls[@]}"; do wait_health "$u"; done

extra=()
[ ${#tool_urls[@]} -gt 0 ] && extra+=("--config.tool_server.url=$(IFS=,; echo "${tool_urls[*]}")")
[ ${#vllm_urls[@]} -gt 0 ] && extra+=(--config.placement.mode=remote
                                      "--config.placement.sampler_urls=$(IFS=,; echo "${vllm_urls[*]}")")
cmd=(python -m verltool_jax.train --config "$spec" "${extra[@]}" "$@")
echo "== ${cmd[*]}"
[ $dry = 1 ] && exit 0
"${cmd[@]}"
