#!/usr/bin/env bash
# One device call: the main job from empty caches (issue 43, acceptance 1), the ten-op cold
# start (cold, warm), the GPU tests of the files changed most, and a GPT-2 training step's
# kernels per optimizer; results packed into $OUT/c.tgz after every step.
D=/tmp/c ARCHIVE=c; . experiments/gpu_steps.sh
SMOKE_BUDGET_S=330 step 335 bench bash experiments/gpu_smoke.sh $D/smoke bench
echo "bench.err lines: $(wc -l < $D/smoke/bench.err)"; head -c 600 $D/smoke/bench.err; tail -3 $D/smoke/bench.log
step 130 coldstart python3 experiments/gpu_coldstart.py --out $D/cs --scenarios cold,warm
TAIL=30 step 95 tests python3 -m pytest -m "not slow" -v -p no:cacheprovider -n 14 --timeout 90 \
  tests/test_launch.py tests/test_warmup.py tests/test_optim.py tests/test_clip.py tests/test_patch.py \
  tests/test_fusion.py tests/test_harness_kinds.py tests/test_norm.py tests/test_sparse.py tests/test_quant.py
grep -E "^(FAILED|ERROR)|passed|failed" $D/tests.log | tail -25
step 90 profile python3 experiments/gpu_step_profile.py --out $D/prof
