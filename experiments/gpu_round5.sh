#!/usr/bin/env bash
# One device call: the two GPU-only failures looked at directly (gpu_diag.py), then the whole
# suite on the GPU (issue 43 acceptance 2, issue 44's OpInfo log), packed into $OUT/c.tgz.
D=/tmp/c5 ARCHIVE=c; . experiments/gpu_steps.sh
TAIL=40 step 60 diag python3 experiments/gpu_diag.py
# The whole suite from empty caches, spread over the cores; -v logs each outcome as it comes.
export TRITON_CACHE_DIR=$(mktemp -d) TRITONKIT_CACHE_DIR=$(mktemp -d)
TAIL=30 step $((575 - SECONDS)) suite python3 -m pytest -v -p no:cacheprovider -n 14 --timeout 300 \
  -rfE --tb=short --durations=30 --junitxml=$D/suite.xml tests
grep -E "^(FAILED|ERROR)|passed|failed" $D/suite.log | tail -30
