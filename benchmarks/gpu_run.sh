#!/usr/bin/env bash
# The GPU run: on a machine with one NVIDIA GPU and nothing but Python (and the package
# registries), make a venv, install the library with its GPU extra, run the GPU tests and the
# GPU benchmarks, and leave everything under $OUT (default ./gpu-results): logs, JUnit XML,
# JSON, nvidia-smi's output. About 8 minutes; every step has a time limit, and a failing step
# does not stop the ones after it (the summary at the end says what happened).
#
#   bash benchmarks/gpu_run.sh            # or OUT=/some/dir bash benchmarks/gpu_run.sh
#
# Without a GPU it still installs everything and gets as far as the skips.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu-results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
VENV=${VENV:-.venv-gpu}
PYTHON=${PYTHON:-python3}
STATUS=()

log() { echo "[gpu_run $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }

step() {  # step NAME SECONDS COMMAND...: run with a limit, output to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  log "start $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "end $name: exit $rc after $((SECONDS - t0))s"
  STATUS+=("$name=$rc")
  return $rc
}

log "checkout $(git rev-parse --short HEAD 2>/dev/null || echo unknown), results in $OUT"
{ nvidia-smi && nvidia-smi topo -m; } > "$OUT/nvidia-smi.txt" 2>&1 \
  || echo "nvidia-smi is not available on this machine" >> "$OUT/nvidia-smi.txt"

if [ ! -x "$VENV/bin/python" ]; then
  step venv 120 "$PYTHON" -m venv "$VENV" || exit 1
fi
step install 300 "$VENV/bin/pip" install -q -e '.[test,mpi,cuda]' || {
  log "installing failed: see $OUT/install.log"; exit 1; }
PY="$VENV/bin/python"
step environment 60 "$PY" -c '
import platform, warnings, numpy, mpi4py, cupy
warnings.simplefilter("ignore")
from cupy.cuda import nccl
print("python", platform.python_version(), "numpy", numpy.__version__, "mpi4py", mpi4py.__version__)
print("cupy", cupy.__version__, "gpu visible", cupy.cuda.is_available())
print("nccl", nccl.get_version() if nccl.available else "not loadable")
if cupy.cuda.is_available():
    for d in range(cupy.cuda.runtime.getDeviceCount()):
        p = cupy.cuda.runtime.getDeviceProperties(d)
        print("device", d, p["name"].decode(), p["totalGlobalMem"] >> 20, "MiB")
'

# The GPU tests (and the host-side tests beside them), then the benchmarks.
step tests-gpu 300 "$PY" -m pytest -q -rs -p no:cacheprovider --timeout 240 tests/gpu \
  --junitxml "$OUT/tests-gpu.xml"
step bench-cupy 120 "$VENV/bin/collectives" bench --backend cupy -n 4 -b 1K -e 1G -f 4 \
  -a auto,ring,rechd -w 1 -r 3 --json "$OUT/bench_cupy.json"
step compare-devices 150 "$PY" benchmarks/gpu_compare.py devices --out "$OUT"
step compare-one-rank 60 "$PY" benchmarks/gpu_compare.py one-rank --out "$OUT"
step compare-two-level 90 env COLLECTIVES_RANKS_PER_NODE=1 "$VENV/bin/mpiexec" -n 2 \
  "$PY" benchmarks/gpu_compare.py two-level --out "$OUT"

log "summary: ${STATUS[*]}"
tail -n 3 "$OUT/tests-gpu.log" | tee -a "$OUT/run.log"
grep -h "^SKIPPED" "$OUT"/compare-*.log 2>/dev/null | tee -a "$OUT/run.log"
log "done after ${SECONDS}s"
