#!/usr/bin/env bash
# One GPU node: the JAX trainer and the vLLM sampler engines share the node's GPUs.
#
#   launch/gpu_node.sh [--dry-run] CONFIG[:ARG] [OVERRIDE ...]
#   launch/gpu_node.sh configs/tiny_math.py --config.model.path=/ckpt/Qwen2.5-1.5B-Instruct
#
# Environment knobs (defaults in brackets):
#   NUM_ENGINES [number of GPUs]   vLLM engines, one per GPU (sampler.num_engines)
#   VLLM_MEM [0.45]                fraction of each GPU vLLM may take (the rest is JAX's)
#   TOOL_SERVER_URL [start one]    use a running tool server instead of starting one
# JAX must not grab all GPU memory up front, or vLLM cannot start: preallocation is off
# and JAX is capped to what vLLM leaves. The trainer's mesh spans all local GPUs
# (mesh_shape defaults to (1, 1, 1), one device; --config.mesh_shape=(-1,1,1) is data parallel over every GPU, (1,-1,1) FSDP).
# --dry-run prints the environment and the command (NUM_GPUS stands in for nvidia-smi).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || { [ -f .venv/bin/activate ] && . .venv/bin/activate; }
dry=0
[ "${1:-}" = "--dry-run" ] && { dry=1; shift; }
[ $# -ge 1 ] || { sed -n '2,15p' "$0"; exit 2; }
spec="$1"; shift

ngpu="${NUM_GPUS:-$(nvidia-smi --list-gpus 2>/dev/null | wc -l)}"
[ "$ngpu" -ge 1 ] || [ $dry = 1 ] || { echo "no GPU found (nvidia-smi); use launch/local.sh on CPU" >&2; exit 1; }
NUM_ENGINES="${NUM_ENGINES:-$ngpu}"
VLLM_MEM="${VLLM_MEM:-0.45}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export XLA_PYTHON_CLIENT_MEM_FRACTION="$(python -c "print(round(0.95 - $VLLM_MEM, 2))")"
export VLLM_ENABLE_V1_MULTIPROCESSING=1 TOKENIZERS_PARALLELISM=false
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

extra=(--config.sampler.backend=vllm "--config.sampler.num_engines=$NUM_ENGINES"
       "--config.sampler.gpu_memory_utilization=$VLLM_MEM" --config.sampler.dtype=bfloat16
       --config.model.dtype=bfloat16 --config.sampler.enforce_eager=false)
[ -n "${TOOL_SERVER_URL:-}" ] && extra+=("--config.tool_server.url=$TOOL_SERVER_URL")

echo "== $ngpu GPU(s), $NUM_ENGINES vLLM engine(s) at $VLLM_MEM of memory each"
cmd=(python -m verltool_jax.train --config "$spec" "${extra[@]}" "$@")
echo "## env XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=$XLA_PYTHON_CLIENT_MEM_FRACTION VLLM_ENABLE_V1_MULTIPROCESSING=1 TOKENIZERS_PARALLELISM=false NCCL_DEBUG=$NCCL_DEBUG"
echo "== ${cmd[*]}"
[ $dry = 1 ] && exit 0
exec "${cmd[@]}"
