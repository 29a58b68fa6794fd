#!/usr/bin/env bash
# One device call: the two GPU-only failures looked at directly (gpu_diag.py), then the whole
# suite on the GPU (issue 43 acceptance 2, issue 44's OpInfo log), packed into $OUT/c.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > /dev/null 2>&1
C=/tmp/c5; mkdir -p $C
pack() { tar czf "$OUT/c.tgz" -C $C .; }
step() { local cap=$1 name=$2; shift 2; local t0=$SECONDS; timeout "$cap" "$@" > "$C/$name.log" 2>&1; echo "$name rc=$? ${SECONDS}s (+$((SECONDS - t0)))" | tee -a $C/summary.txt; tail -${TAIL:-12} "$C/$name.log"; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $C/gpu.txt
TAIL=40 step 60 diag python3 experiments/gpu_diag.py
# The whole suite from empty caches, spread over the cores; -v logs each outcome as it comes.
export TRITON_CACHE_DIR=$(mktemp -d) TRITONKIT_CACHE_DIR=$(mktemp -d)
TAIL=30 step $((575 - SECONDS)) suite python3 -m pytest -v -p no:cacheprovider -n 14 --timeout 300 \
  -rfE --tb=short --durations=30 --junitxml=$C/suite.xml tests
grep -E "^(FAILED|ERROR)|passed|failed" $C/suite.log | tail -30
