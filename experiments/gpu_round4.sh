#!/usr/bin/env bash
# One device call: the tests that failed on the H100 with their tracebacks, a GPT-2 training
# step's kernels and host phases per optimizer (why the GPU idles with tritonkit's AdamW), then
# the main job from empty caches (issue 43, acceptance 1); results packed into $OUT/c.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > /dev/null 2>&1
C=/tmp/c; mkdir -p $C
pack() { tar czf "$OUT/c.tgz" -C $C .; }
step() { local cap=$1 name=$2; shift 2; local t0=$SECONDS; timeout "$cap" "$@" > "$C/$name.log" 2>&1; echo "$name rc=$? ${SECONDS}s (+$((SECONDS - t0)))" | tee -a $C/summary.txt; tail -${TAIL:-12} "$C/$name.log"; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $C/gpu.txt
cat $C/gpu.txt
TAIL=40 step 110 failed python3 -m pytest -p no:cacheprovider -n 12 --timeout 100 --tb=short -rfE \
  tests/test_warmup.py tests/test_launch.py tests/test_harness_kinds.py \
  tests/test_optim.py::test_the_sync_check_sees_a_sync tests/test_optim.py::test_default_ns_config_on_this_gpu \
  tests/test_optim.py::test_default_step_never_syncs tests/test_quant.py::test_float8_linear_forward_backward
step 100 profile python3 experiments/gpu_step_profile.py --out $C/prof
cat $C/prof/*.host.json
SMOKE_BUDGET_S=$((560 - SECONDS)) step $((565 - SECONDS)) bench bash experiments/gpu_smoke.sh $C/smoke bench
echo "bench.err lines: $(wc -l < $C/smoke/bench.err)"; head -c 600 $C/smoke/bench.err; tail -3 $C/smoke/bench.log
