# Sourced by the gpu_round*.sh scripts, one device call each: steps capped in seconds, each
# step's output in D/<step>.log and a line in D/summary.txt, and D packed into
# $OUT/$ARCHIVE.tgz after every step, with src/tritonkit/tuned (where a tune step writes the
# shipped tables), so that a call cut at its limit still brings back what was done.
#
#   D=/tmp/c ARCHIVE=c; . experiments/gpu_steps.sh
#   step CAP NAME COMMAND...          # TAIL=N: lines of its log echoed (default 12)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /dev/null 2>&1
fi
mkdir -p "$D"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$D/gpu.txt" 2>&1
pack() { cp -r src/tritonkit/tuned "$D/" 2> /dev/null; tar czf "$OUT/$ARCHIVE.tgz" -C "$D" .; }
step() {
  local cap=$1 name=$2
  shift 2
  local t0=$SECONDS
  timeout "$cap" "$@" > "$D/$name.log" 2>&1
  echo "$name rc=$? ${SECONDS}s (+$((SECONDS - t0)))" | tee -a "$D/summary.txt"
  tail -"${TAIL:-12}" "$D/$name.log"
  pack
}
