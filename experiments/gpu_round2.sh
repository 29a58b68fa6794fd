#!/usr/bin/env bash
# One device call: the GPU's remaining shipped tables (attention, matmul/linear, decode linears),
# the decode GEMMs again on them, issue 43's training-loop acceptance (gpu_models --sections
# optim) and the OpInfo drop-in test; results packed into $OUT/b.tgz after every step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
B=/tmp/b; mkdir -p $B
pack() { cp -r src/tritonkit/tuned $B/ 2>/dev/null; tar czf "$OUT/b.tgz" -C $B .; }
step() { local cap=$1 name=$2; shift 2; local t0=$SECONDS; timeout "$cap" "$@" > "$B/$name.log" 2>&1; echo "$name rc=$? ${SECONDS}s (+$((SECONDS - t0)))" | tee -a $B/summary.txt; tail -${TAIL:-12} "$B/$name.log"; pack; }
step 170 tune env TRITONKIT_AUTOTUNE_BUDGET=4 bash experiments/gpu_tune_ship.sh $B attention matmul decode
step 60 decode python3 experiments/gpu_decode.py --out $B/decode --autotune 0 --no-python-path
TAIL=20 step 260 models python3 experiments/gpu_models.py --sections optim --out $B/models
step 80 opinfo python3 -m pytest tests/test_opinfo.py -v -p no:cacheprovider -n 8
