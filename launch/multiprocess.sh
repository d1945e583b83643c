#!/usr/bin/env bash
# Multi-host training on one machine: NUM_PROCESSES trainer processes in one jax.distributed
# cluster, each running the same command (how every host of a real cluster runs it).
#
#   launch/multiprocess.sh [--dry-run] CONFIG[:ARG] [OVERRIDE ...]
#
# Process i gets JAX_COORDINATOR_ADDRESS=127.0.0.1:COORDINATOR_PORT, JAX_NUM_PROCESSES,
# JAX_PROCESS_ID=i and its devices: PLATFORM=cpu simulates DEVICES_PER_PROCESS CPU devices
# (XLA_FLAGS=--xla_force_host_platform_device_count, JAX_PLATFORMS=cpu); PLATFORM=gpu gives
# it GPUs i*DEVICES_PER_PROCESS .. (i+1)*DEVICES_PER_PROCESS-1 (CUDA_VISIBLE_DEVICES).
# The trainer needs --config.mesh_shape over every process's devices, e.g. (1,-1,1), and
# trainer.batch_groups a multiple of NUM_PROCESSES. Process 0's console is this one; process
# i > 0 writes its console to OUT/process<i>.console (its library log is
# <out_dir>/run.process<i>.log). When one process fails the others are stopped; the exit
# code is the first failure's. Environment (defaults in brackets):
#   NUM_PROCESSES [2]  DEVICES_PER_PROCESS [1]  PLATFORM [cpu]  COORDINATOR_PORT [12355]
#   OUT [runs/multiprocess]
# --dry-run prints every command (with its environment) and starts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || { [ -f .venv/bin/activate ] && . .venv/bin/activate; }
dry=0
[ "${1:-}" = "--dry-run" ] && { dry=1; shift; }
[ $# -ge 1 ] || { sed -n '2,18p' "$0"; exit 2; }
spec="$1"; shift

NUM_PROCESSES="${NUM_PROCESSES:-2}"; DEVICES_PER_PROCESS="${DEVICES_PER_PROCESS:-1}"
PLATFORM="${PLATFORM:-cpu}"; COORDINATOR_PORT="${COORDINATOR_PORT:-12355}"
OUT="${OUT:-runs/multiprocess}"
case "$PLATFORM" in cpu|gpu) ;; *) echo "PLATFORM must be cpu or gpu, got $PLATFORM" >&2; exit 2;; esac
[ "$NUM_PROCESSES" -ge 1 ] && [ "$DEVICES_PER_PROCESS" -ge 1 ] || {
  echo "NUM_PROCESSES and DEVICES_PER_PROCESS must be >= 1" >&2; exit 2; }
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "## env TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=$HF_HUB_OFFLINE PYTHONPATH=$PYTHONPATH"

# Each process in its own session: a Ctrl-C here reaches them once, as the SIGTERM the
# trap forwards (they finish the step, save and exit 130; the same command resumes).
declare -A live=()
forward() { for p in "${!live[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap forward INT TERM
trap 'forward' EXIT

[ $dry = 1 ] || mkdir -p "$OUT"
for ((i = 0; i < NUM_PROCESSES; i++)); do
  env_i=(JAX_COORDINATOR_ADDRESS="127.0.0.1:$COORDINATOR_PORT" JAX_NUM_PROCESSES="$NUM_PROCESSES"
         JAX_PROCESS_ID="$i")
  if [ "$PLATFORM" = cpu ]; then
    env_i+=(JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=$DEVICES_PER_PROCESS")
  else
    first=$((i * DEVICES_PER_PROCESS))
    env_i+=(CUDA_VISIBLE_DEVICES="$(seq -s, "$first" $((first + DEVICES_PER_PROCESS - 1)))")
  fi
  cmd=(python -m verltool_jax.train --config "$spec" "$@")
  if [ "$i" = 0 ]; then
    echo "== ${env_i[*]} ${cmd[*]} &"
    [ $dry = 1 ] || { setsid env "${env_i[@]}" "${cmd[@]}" & live[$!]=1; }
  else
    echo "== ${env_i[*]} ${cmd[*]} > $OUT/process$i.console &"
    [ $dry = 1 ] || { setsid env "${env_i[@]}" "${cmd[@]}" > "$OUT/process$i.console" 2>&1 &
                      live[$!]=1; }
  fi
done
[ $dry = 1 ] && exit 0

# Wait for all; the first process to fail stops the others (they would wait for it in a
# collective until jax.distributed's heartbeat timeout).
rc=0
while [ ${#live[@]} -gt 0 ]; do
  done_pid=""
  set +e; wait -n -p done_pid "${!live[@]}"; r=$?; set -e
  if [ -z "${done_pid:-}" ]; then       # a forwarded signal interrupted the wait
    for p in "${!live[@]}"; do kill -0 "$p" 2>/dev/null || unset "live[$p]"; done
    continue
  fi
  unset "live[$done_pid]"
  if [ "$r" -ne 0 ] && [ "$rc" -eq 0 ]; then
    rc=$r
    if [ ${#live[@]} -gt 0 ] && [ "$r" -ne 130 ]; then
      echo "[multiprocess] a process exited with $r; stopping the others" >&2
      forward
    fi
  fi
done
exit $rc
