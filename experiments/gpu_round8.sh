#!/usr/bin/env bash
# One device call (issue 43, acceptance 3 and points 6-8): the training loop at the optimizers'
# defaults twice (each in fresh processes: the patched GPT-2 step is host-bound and its host
# time varies between processes), the cold start and a patched Llama's first step against
# Liger's, the three untuned decode shapes, then the decode GEMMs on the H100's tables; results
# packed into $OUT/c.tgz after every step.
D=/tmp/c8 ARCHIVE=c; . experiments/gpu_steps.sh
TAIL=20 step 130 models python3 experiments/gpu_models.py --sections optim --out $D/models
TAIL=20 step 130 models2 python3 experiments/gpu_models.py --sections optim --out $D/models2
step 60 coldstart python3 experiments/gpu_coldstart.py --out $D/cs --scenarios cold,warm,after_warmup
step 60 first_step python3 experiments/gpu_models.py --sections cold --configs llama-2k \
  --variants liger,tk --out $D/first
TRITONKIT_AUTOTUNE_BUDGET=15 step 90 tune_decode python3 -m tritonkit tune linear --ship \
  --shapes "(4, 14336, 4096)" "(8, 14336, 4096)" "(16, 14336, 4096)"
TAIL=30 step $((575 - SECONDS)) decode python3 experiments/gpu_decode.py --out $D/decode --no-python-path
