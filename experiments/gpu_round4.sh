#!/usr/bin/env bash
# One device call: the tests that failed on the H100 with their tracebacks, a GPT-2 training
# step's kernels and host phases per optimizer (why the GPU idles with tritonkit's AdamW), then
# the main job from empty caches (issue 43, acceptance 1); results packed into $OUT/c.tgz.
D=/tmp/c ARCHIVE=c; . experiments/gpu_steps.sh
TAIL=40 step 110 failed python3 -m pytest -p no:cacheprovider -n 12 --timeout 100 --tb=short -rfE \
  tests/test_warmup.py tests/test_launch.py tests/test_harness_kinds.py \
  tests/test_optim.py::test_the_sync_check_sees_a_sync tests/test_optim.py::test_default_ns_config_on_this_gpu \
  tests/test_optim.py::test_default_step_never_syncs tests/test_quant.py::test_float8_linear_forward_backward
step 100 profile python3 experiments/gpu_step_profile.py --out $D/prof
cat $D/prof/*.host.json
SMOKE_BUDGET_S=$((560 - SECONDS)) step $((565 - SECONDS)) bench bash experiments/gpu_smoke.sh $D/smoke bench
echo "bench.err lines: $(wc -l < $D/smoke/bench.err)"; head -c 600 $D/smoke/bench.err; tail -3 $D/smoke/bench.log
