#!/usr/bin/env bash
# A Cloud TPU VM pod slice: the same command on every host (JAX multi-controller).
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a launch/tpu_pod.sh [--dry-run] CONFIG[:ARG] [OVERRIDE ...]
#
# Copies the working tree to every host (gcloud ... scp --worker=all), sets it up once
# (SETUP=1), and runs `python -m verltool_jax.train` on all hosts at once. On TPU the
# sampler is the JAX backend (sampler.backend=jax; vLLM's CUDA/CPU engines do not run
# there), sharded over the same mesh. The tool server runs on host 0 and listens on
# its internal IP; the other hosts reach it over the pod network.
# jax.distributed.initialize() finds the pod topology by itself on TPU VMs.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
[ "${1:-}" = "--dry-run" ] && { dry=1; shift; }
[ $# -ge 1 ] || { sed -n '2,11p' "$0"; exit 2; }
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
spec="$1"; shift
run() { echo "== $*"; [ $dry = 1 ] || "$@"; }
remote_dir="${REMOTE_DIR:-verltool-jax}"
gssh=(gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all)

run tar czf /tmp/verltool-jax.tgz --exclude=.venv --exclude=runs --exclude=.git .
run gcloud compute tpus tpu-vm scp /tmp/verltool-jax.tgz "$TPU_NAME:/tmp/" --zone "$ZONE" --worker=all
run "${gssh[@]}" --command "mkdir -p $remote_dir && tar xzf /tmp/verltool-jax.tgz -C $remote_dir"

if [ "${SETUP:-0}" = 1 ]; then
  run "${gssh[@]}" --command "cd $remote_dir && python3 -m venv .venv && . .venv/bin/activate \
    && pip install -q -U 'jax[tpu]' -e ."
fi

if [ $dry = 1 ]; then
  host0_ip="${HOST0_IP:-HOST0_IP}"
else
  host0_ip="$(gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone "$ZONE" \
    --format='value(networkEndpoints[0].ipAddress)')"
fi
tool_url="${TOOL_SERVER_URL:-http://${host0_ip}:30888}"
if [ -z "${TOOL_SERVER_URL:-}" ]; then
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=0 --command \
    "cd $remote_dir && . .venv/bin/activate && nohup python -m tool_server --host 0.0.0.0 \
     --port 30888 --tools python_code > tool_server.log 2>&1 &"
fi

overrides=""
for o in "$@"; do overrides+=" $(printf '%q' "$o")"; done
run "${gssh[@]}" --command "cd $remote_dir && . .venv/bin/activate && \
  python -m verltool_jax.train --config $spec --config.sampler.backend=jax \
  --config.tool_server.url=$tool_url --config.model.dtype=bfloat16 $overrides"
