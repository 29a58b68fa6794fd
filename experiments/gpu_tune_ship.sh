#!/usr/bin/env bash
# The shipped tuning tables for the GPU this runs on (src/tritonkit/tuned/<gpu>/), the same set
# as the H200's: attention at the cold-start and bench shapes, matmul/linear at the bench shapes
# and 8192x11008x4096, the float8 GEMM at 4096^3, the weight-only int8 GEMMs at decode shapes.
#
#   bash experiments/gpu_tune_ship.sh DIR [GROUP...]   # copies the tables to DIR/tuned-<gpu>.tgz
#   groups: attention matmul decode float8 int8wo (default: all)
set -u
DIR=${1:?usage: gpu_tune_ship.sh DIR [attention matmul decode float8 int8wo]}
shift
GROUPS_=" ${*:-attention matmul decode float8 int8wo} "
on() { [[ $GROUPS_ == *" $1 "* ]]; }
mkdir -p "$DIR"
export PYTHONPATH=/tmp/site:src TRITONKIT_AUTOTUNE_BUDGET=${TRITONKIT_AUTOTUNE_BUDGET:-15}
tk() { python3 -m tritonkit tune "$@" --ship >> "$DIR/tune.log" 2>&1; echo "tune $* rc=$?" >> "$DIR/tune.log"; }
# --shapes takes either the named set or tuples, so each is its own call.
if on attention; then
  tk attention --shapes "(2, 16, 16, 2048, 2048, 128, 'causal')"
  tk attention --shapes bench
fi
if on matmul; then
  tk matmul linear --shapes "(8192, 11008, 4096)"
  tk matmul linear --shapes bench
fi
# decode (M <= 16) linears, (M, N, K): the 8192^2 and 4096 -> 14336 weights
on decode && tk linear --shapes "(1, 8192, 8192)" "(2, 8192, 8192)" "(4, 8192, 8192)" "(8, 8192, 8192)" \
  "(16, 8192, 8192)" "(1, 14336, 4096)" "(2, 14336, 4096)" "(4, 14336, 4096)" \
  "(8, 14336, 4096)" "(16, 14336, 4096)"
on float8 && tk float8_linear --shapes "(4096, 4096, 4096)"
on int8wo && tk int8_weight_only_linear --shapes bench
gpu=$(python3 -c "import torch, re; print(re.sub('[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
tar czf "$DIR/tuned-$gpu.tgz" -C src/tritonkit/tuned "$gpu"
grep -E "rc=|tuned|from the cache" "$DIR/tune.log" | tail -20
