#!/usr/bin/env bash
# One device call: the main job from empty caches (issue 43, acceptance 1), the ten-op cold
# start (cold, warm), the GPU tests of the files changed most, and a GPT-2 training step's
# kernels per optimizer; results packed into $OUT/c.tgz after every step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
C=/tmp/c; mkdir -p $C
pack() { tar czf "$OUT/c.tgz" -C $C .; }
step() { local cap=$1 name=$2; shift 2; local t0=$SECONDS; timeout "$cap" "$@" > "$C/$name.log" 2>&1; echo "$name rc=$? ${SECONDS}s (+$((SECONDS - t0)))" | tee -a $C/summary.txt; tail -${TAIL:-12} "$C/$name.log"; pack; }
SMOKE_BUDGET_S=330 step 335 bench bash experiments/gpu_smoke.sh $C/smoke bench
echo "bench.err lines: $(wc -l < $C/smoke/bench.err)"; head -c 600 $C/smoke/bench.err; tail -3 $C/smoke/bench.log
step 130 coldstart python3 experiments/gpu_coldstart.py --out $C/cs --scenarios cold,warm
TAIL=30 step 95 tests python3 -m pytest -m "not slow" -v -p no:cacheprovider -n 14 --timeout 90 \
  tests/test_launch.py tests/test_warmup.py tests/test_optim.py tests/test_clip.py tests/test_patch.py \
  tests/test_fusion.py tests/test_harness_kinds.py tests/test_norm.py tests/test_sparse.py tests/test_quant.py
grep -E "^(FAILED|ERROR)|passed|failed" $C/tests.log | tail -25
step 90 profile python3 experiments/gpu_step_profile.py --out $C/prof
