#!/usr/bin/env bash
# One-GPU jobs side by side on a machine of several GPUs, one GPU each, in one device call
# (a machine of several GPUs counts its held time once, whatever runs on it).
#
#   bash experiments/gpu_parallel.sh DIR CAP 'NAME@GPU[@SECONDS]: COMMAND' ...
#
# Each job runs `bash -c COMMAND` under `timeout` (its SECONDS, else CAP) with CUDA_VISIBLE_DEVICES=GPU and its
# own Triton and tritonkit caches; JOB_OUT is its results folder, DIR/NAME, and its output
# goes to DIR/NAME/log.txt. Jobs on the same GPU run one after the other, in the order given.
# DIR is packed into $OUT/$(basename DIR).tgz every 30 s and at the end, so that a call cut
# at its limit still brings back what was done. DIR/summary.txt: one line per job (exit code,
# seconds).
set -u
DIR=${1:?usage: gpu_parallel.sh DIR CAP 'NAME@GPU: COMMAND' ...}
CAP=${2:?cap in seconds}
shift 2
export PYTHONUNBUFFERED=1
mkdir -p "$DIR"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > "$DIR/gpus.txt" 2>&1
pack() { tar czf "$OUT/$(basename "$DIR").tgz" -C "$DIR" . 2> /dev/null; }

declare -A QUEUE
for job in "$@"; do
  head=${job%%:*}
  gpu=${head#*@}
  gpu=${gpu%%@*}
  QUEUE[$gpu]+="${job}"$'\n'
done

run_queue() {
  local gpu=$1 line head name cap cmd t0
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    head=${line%%:*}
    name=${head%%@*}
    cap=${head#*@}
    cap=${cap#*@}
    [ "$cap" = "$gpu" ] && cap=$CAP
    cmd=${line#*: }
    mkdir -p "$DIR/$name" "/tmp/caches/$name"
    t0=$SECONDS
    CUDA_VISIBLE_DEVICES=$gpu JOB_OUT=$DIR/$name TRITON_CACHE_DIR=/tmp/caches/$name/triton \
      TRITONKIT_CACHE_DIR=/tmp/caches/$name/tk timeout "$cap" bash -c "$cmd" \
      > "$DIR/$name/log.txt" 2>&1
    echo "$name gpu=$gpu rc=$? seconds=$((SECONDS - t0))" >> "$DIR/summary.txt"
  done <<< "${QUEUE[$gpu]}"
}

PIDS=()
for gpu in "${!QUEUE[@]}"; do
  run_queue "$gpu" &
  PIDS+=($!)
done
running() { local p; for p in "${PIDS[@]}"; do kill -0 "$p" 2> /dev/null && return 0; done; return 1; }
while running; do
  sleep 10
  pack
done
wait
pack
cat "$DIR/summary.txt"
