#!/usr/bin/env bash
# One device call of measurements that need no fresh caches, each step capped, the results
# packed into $OUT/a.tgz after every step (a call cut off at its limit still returns them):
# the GPU's shipped tables (tune + optimizer sweep), decode GEMMs, soft-target cross-entropy,
# the sparse rows' agreement.   bash experiments/gpu_round1.sh
D=/tmp/a ARCHIVE=a; . experiments/gpu_steps.sh
step 170 tune env TRITONKIT_AUTOTUNE_BUDGET=6 bash experiments/gpu_tune_ship.sh $D
step 120 optim python3 experiments/gpu_optim_defaults.py --out $D/od --ship
step 130 decode python3 experiments/gpu_decode.py --out $D/decode --autotune 0
step 80 soft_ce python3 experiments/gpu_soft_ce.py --out $D/soft_ce
step 80 sparse python3 experiments/gpu_sparse.py --sections agreement --out $D/sparse
