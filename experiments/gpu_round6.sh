#!/usr/bin/env bash
# One device call: the training loop at the optimizers' defaults (issue 43 acceptance 3), the
# H100's matmul/linear and decode tables (point 8) and the decode GEMMs (point 6) with them;
# the cold start at the defaults (point 7); results packed into $OUT/c.tgz after every step.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > /dev/null 2>&1
C=/tmp/c6; mkdir -p $C
pack() { tar czf "$OUT/c.tgz" -C $C .; }
step() { local cap=$1 name=$2; shift 2; local t0=$SECONDS; timeout "$cap" "$@" > "$C/$name.log" 2>&1; echo "$name rc=$? ${SECONDS}s (+$((SECONDS - t0)))" | tee -a $C/summary.txt; tail -${TAIL:-12} "$C/$name.log"; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $C/gpu.txt
TAIL=20 step 200 models python3 experiments/gpu_models.py --sections optim --out $C/models
step 90 coldstart python3 experiments/gpu_coldstart.py --out $C/cs --scenarios cold,warm
step 200 tune bash experiments/gpu_tune_ship.sh $C/tune matmul decode
TAIL=30 step $((570 - SECONDS)) decode python3 experiments/gpu_decode.py --out $C/decode --no-python-path
