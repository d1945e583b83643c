#!/usr/bin/env bash
# Multi-node GPU training under SLURM: one process per node, JAX multi-controller.
#
#   sbatch --nodes=4 launch/slurm_multinode.sh CONFIG[:ARG] [OVERRIDE ...]
#   launch/slurm_multinode.sh --dry-run CONFIG[:ARG] [OVERRIDE ...]   # print, run nothing
#
# Node 0 also runs the tool server (its URL is passed to every process) unless
# TOOL_SERVER_URL is set. Every node runs vLLM engines on its own GPUs; the trainer's
# mesh spans all nodes (jax.distributed.initialize reads the SLURM variables:
# coordinator = first node, process id = SLURM_PROCID). Weights are resynced from the
# trainer to every engine after each step. Logs go to runs/slurm-<jobid>/.
#SBATCH --job-name=verltool-jax
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --output=runs/slurm-%j/%t.log
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
[ -n "${VIRTUAL_ENV:-}" ] || { [ -f .venv/bin/activate ] && . .venv/bin/activate; }
dry=0
[ "${1:-}" = "--dry-run" ] && { dry=1; shift; }
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
[ -n "${SLURM_JOB_ID:-}" ] || [ $dry = 1 ] || { echo "submit with sbatch (see the header)" >&2; exit 2; }
spec="$1"; shift
run() { echo "== $*"; [ $dry = 1 ] || "$@"; }

if [ $dry = 1 ] && [ -z "${SLURM_JOB_ID:-}" ]; then
  SLURM_JOB_ID=DRYRUN; head_node="${HEAD_NODE:-node0}"
else
  head_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"
fi
export COORDINATOR_ADDRESS="${head_node}:${COORDINATOR_PORT:-12355}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.5
export TOKENIZERS_PARALLELISM=false NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
out="runs/slurm-${SLURM_JOB_ID}"
echo "## env COORDINATOR_ADDRESS=$COORDINATOR_ADDRESS XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 TOKENIZERS_PARALLELISM=false NCCL_DEBUG=$NCCL_DEBUG"
[ $dry = 1 ] || mkdir -p "$out"

if [ -z "${TOOL_SERVER_URL:-}" ]; then
  port="${TOOL_SERVER_PORT:-30888}"
  tcmd=(srun --nodes=1 --ntasks=1 -w "$head_node" --overlap
        python -m tool_server --host 0.0.0.0 --port "$port" --tools python_code)
  echo "== ${tcmd[*]} > $out/tool_server.log &"
  [ $dry = 1 ] || { "${tcmd[@]}" > "$out/tool_server.log" 2>&1 & }
  TOOL_SERVER_URL="http://${head_node}:${port}"
  if [ $dry = 0 ]; then
    for _ in $(seq 60); do curl -sf "$TOOL_SERVER_URL/health" >/dev/null && break; sleep 2; done
  fi
fi

run srun --ntasks-per-node=1 --kill-on-bad-exit=1 \
  python -m verltool_jax.train --config "$spec" \
    "--config.tool_server.url=$TOOL_SERVER_URL" "--config.trainer.out_dir=$out" \
    --config.sampler.num_engines="${ENGINES_PER_NODE:-8}" \
    --config.sampler.gpu_memory_utilization=0.45 --config.sampler.dtype=bfloat16 \
    --config.model.dtype=bfloat16 "$@"
