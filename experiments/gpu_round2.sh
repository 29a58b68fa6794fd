#!/usr/bin/env bash
# One device call: the GPU's remaining shipped tables (attention, matmul/linear, decode linears),
# the decode GEMMs again on them, issue 43's training-loop acceptance (gpu_models --sections
# optim) and the OpInfo drop-in test; results packed into $OUT/b.tgz after every step.
D=/tmp/b ARCHIVE=b; . experiments/gpu_steps.sh
step 170 tune env TRITONKIT_AUTOTUNE_BUDGET=4 bash experiments/gpu_tune_ship.sh $D attention matmul decode
step 60 decode python3 experiments/gpu_decode.py --out $D/decode --autotune 0 --no-python-path
TAIL=20 step 260 models python3 experiments/gpu_models.py --sections optim --out $D/models
step 80 opinfo python3 -m pytest tests/test_opinfo.py -v -p no:cacheprovider -n 8
