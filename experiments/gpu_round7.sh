#!/usr/bin/env bash
# One device call (issue 43, acceptance 2): the fast tier from empty caches on its own (its
# time is the figure), then the slow tier; results packed into $OUT/c.tgz. About 9 minutes
# on one H100 with 16 cores.
D=/tmp/c7 ARCHIVE=c; . experiments/gpu_steps.sh
export TRITON_CACHE_DIR=$(mktemp -d) TRITONKIT_CACHE_DIR=$(mktemp -d)
TAIL=30 step 420 fast python3 -m pytest -m "not slow" -v -p no:cacheprovider -n 14 --timeout 300 \
  -rfE --tb=short --durations=20 tests
TAIL=30 step $((575 - SECONDS)) slow python3 -m pytest -m slow -v -p no:cacheprovider -n 14 \
  --timeout 300 -rfE --tb=short --durations=20 tests
grep -hE "^(FAILED|ERROR)|passed|failed" $D/fast.log $D/slow.log | tail -30
