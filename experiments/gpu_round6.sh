#!/usr/bin/env bash
# One device call: the training loop at the optimizers' defaults (issue 43 acceptance 3), the
# H100's matmul/linear and decode tables (point 8) and the decode GEMMs (point 6) with them;
# the cold start at the defaults (point 7); results packed into $OUT/c.tgz after every step.
D=/tmp/c6 ARCHIVE=c; . experiments/gpu_steps.sh
TAIL=20 step 200 models python3 experiments/gpu_models.py --sections optim --out $D/models
step 90 coldstart python3 experiments/gpu_coldstart.py --out $D/cs --scenarios cold,warm
step 200 tune bash experiments/gpu_tune_ship.sh $D/tune matmul decode
TAIL=30 step $((570 - SECONDS)) decode python3 experiments/gpu_decode.py --out $D/decode --no-python-path
