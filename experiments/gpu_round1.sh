#!/usr/bin/env bash
# One device call of measurements that need no fresh caches, each step capped, the results
# packed into $OUT/a.tgz after every step (a call cut off at its limit still returns them):
# the GPU's shipped tables (tune + optimizer sweep), decode GEMMs, soft-target cross-entropy,
# the sparse rows' agreement.   bash experiments/gpu_round1.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
A=/tmp/a; mkdir -p $A
pack() { cp -r src/tritonkit/tuned $A/ 2>/dev/null; tar czf "$OUT/a.tgz" -C $A .; }
step() { local cap=$1 name=$2; shift 2; local t0=$SECONDS; timeout "$cap" "$@" > "$A/$name.log" 2>&1; echo "$name rc=$? ${SECONDS}s (+$((SECONDS - t0)))" | tee -a $A/summary.txt; tail -25 "$A/$name.log"; pack; }
step 170 tune env TRITONKIT_AUTOTUNE_BUDGET=6 bash experiments/gpu_tune_ship.sh $A
step 120 optim python3 experiments/gpu_optim_defaults.py --out $A/od --ship
step 130 decode python3 experiments/gpu_decode.py --out $A/decode --autotune 0
step 80 soft_ce python3 experiments/gpu_soft_ce.py --out $A/soft_ce
step 80 sparse python3 experiments/gpu_sparse.py --sections agreement --out $A/sparse
