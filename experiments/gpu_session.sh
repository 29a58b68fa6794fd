#!/usr/bin/env bash
# One GPU session's measurements, run in the background on the device machine (setsid), each
# step logging to $RES/<step>.log and leaving its results under $RES; `tail $RES/progress` says
# where it is. Steps: the replay module's build, the bench of every family with the small
# shapes (one report per family, merged at the end), the old tree's and the new tree's kernel
# times for regress, the GPU tests, the row families' script, any experiments/gpu_NAME.py
# (script:NAME) and the check engine.
#
#   RES=/tmp/res setsid bash experiments/gpu_session.sh STEPS... > /dev/null 2>&1 < /dev/null &
#
# The device tool gives a machine back 30 s after a call returns, so while this runs keep one
# call in flight (e.g. `sleep 540; cat /tmp/res/progress`), and fetch results by copying them
# under $OUT in the last call (kill steps with a pattern that cannot match the calling command
# itself, e.g. `pkill -f "[g]pu_session"`).
set -u
RES=${RES:-/tmp/res}
mkdir -p "$RES"
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 TRITONKIT_GIT_COMMIT=${TRITONKIT_GIT_COMMIT:-}
step() { echo "$(date +%T) $*" >> "$RES/progress"; }

for s in "$@"; do
  case $s in
    build)
      step build
      python3 -c "from tritonkit.ops._core import replay; print(replay.extension(wait=True), replay.STATS.disabled)" > "$RES/build.log" 2>&1 ;;
    bench:*)
      fam=${s#bench:}  # a family or a comma list of operators
      step "bench $fam"
      name=${fam%%,*}
      python3 -m tritonkit bench ${fam//,/ } --small --no-check --out "$RES/bench-$name" --force \
        > "$RES/bench-$name.log" 2>&1 ;;
    regress-old)
      step regress-old
      PYTHONPATH=/tmp/site:oldtree/src python3 experiments/gpu_regress.py "$RES/regress-old.json" > "$RES/regress-old.log" 2>&1 ;;
    regress-new)
      step regress-new
      python3 experiments/gpu_regress.py "$RES/regress-new.json" --against "$RES/regress-old.json" > "$RES/regress-new.log" 2>&1 ;;
    tests)
      step tests
      python3 -m pytest -q -p no:cacheprovider tests/test_bad_input.py tests/test_cuda_graphs.py tests/test_replay.py tests/test_launch.py tests/test_dispatch.py > "$RES/tests.log" 2>&1 ;;
    rows)
      step rows
      OUT=$RES python3 experiments/gpu_rows.py --quick > "$RES/rows.log" 2>&1 ;;
    script:*)  # experiments/gpu_NAME.py, its files under $RES/NAME
      name=${s#script:}
      step "script $name"
      mkdir -p "$RES/$name"
      OUT=$RES/$name python3 "experiments/gpu_$name.py" > "$RES/$name.log" 2>&1 ;;
    check:*)
      fam=${s#check:}
      step "check $fam"
      python3 -m tritonkit check "$fam" --json "$RES/check-$fam.json" > "$RES/check-$fam.log" 2>&1 ;;
    *)
      step "unknown step $s" ;;
  esac
done
step done
