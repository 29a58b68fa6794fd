#!/usr/bin/env bash
# The known state of a freshly started GPU machine, in one device call of at most 9 minutes:
# the main job from empty caches, the cold start and the GPU fast tier (as much of it as the
# time left allows). Run it first whenever a GPU machine is started.
#
#   bash experiments/gpu_smoke.sh DIR [STEP...]     # steps: env bench coldstart tests (default: all)
#   SMOKE_BUDGET_S=540 SMOKE_TEST_WORKERS=12 ...    # the whole budget; pytest-xdist workers
#
# Each step logs to DIR/<step>.log (stderr of the main job apart, DIR/bench.err, so that a
# warning there is seen); DIR/summary.txt has one line per step: exit code, seconds. The
# device tool brings back at most 8 files, so pack DIR: `tar czf $OUT/smoke.tgz -C DIR .`.
# Wheels carried in .whl/ (pytest-xdist, pytest-timeout, ...) are installed first when there.
set -u
DIR=${1:?usage: gpu_smoke.sh DIR [env bench coldstart tests]}
shift
STEPS=${*:-env bench coldstart tests}
BUDGET=${SMOKE_BUDGET_S:-540}
mkdir -p "$DIR"
START=$(date +%s)
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$DIR/wheels.log" 2>&1
fi

left() { echo $((BUDGET - ($(date +%s) - START))); }
record() { echo "$1 rc=$2 seconds=$3" >> "$DIR/summary.txt"; }

for s in $STEPS; do
  t0=$(date +%s)
  case $s in
    env)
      { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())";
        python3 -m pip list 2>/dev/null | grep -iE "^(torch|triton|numpy|pytest|transformers|matplotlib|scipy|liger|expecttest|ruff)"; } > "$DIR/env.log" 2>&1
      rc=$? ;;
    bench)
      # The README's main job, as a new user runs it: empty Triton and tritonkit caches.
      TRITON_CACHE_DIR=$(mktemp -d) TRITONKIT_CACHE_DIR=$(mktemp -d) \
        timeout "$(left)" python3 -m tritonkit bench --out "$DIR/report" > "$DIR/bench.log" 2> "$DIR/bench.err"
      rc=$? ;;
    coldstart)
      timeout "$(left)" python3 experiments/gpu_coldstart.py --out "$DIR/coldstart" > "$DIR/coldstart.log" 2>&1
      rc=$? ;;
    tests)
      # The fast tier with what time is left, spread over the CPU cores (compilation is the cost).
      workers=${SMOKE_TEST_WORKERS:-$(($(nproc) - 2))}
      par=()
      python3 -c "import xdist" 2> /dev/null && par=(-n "$workers")
      python3 -c "import pytest_timeout" 2> /dev/null && par+=(--timeout 300)
      # -v: each outcome is logged as it comes, so a run cut off at the budget still names its
      # failures (grep -E "FAILED|ERROR" tests.log).
      timeout "$(( $(left) - 5 ))" python3 -m pytest -m "not slow" -v -p no:cacheprovider \
        -p no:benchmark "${par[@]}" --junitxml="$DIR/tests.xml" --durations=40 tests \
        > "$DIR/tests.log" 2>&1
      rc=$? ;;
    *)
      echo "unknown step $s" >&2; rc=2 ;;
  esac
  record "$s" "$rc" $(($(date +%s) - t0))
done
cat "$DIR/summary.txt"
