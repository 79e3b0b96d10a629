#!/usr/bin/env bash
# The GPU run, for a machine with one NVIDIA GPU and no network: its python3 (3.12) brings
# CuPy 14, NCCL, NumPy, pytest and pytest-timeout, PyTorch and mpi4py without an MPI library;
# the MPICH and mpi4py wheels (and ml_dtypes and pytest-xdist, used where the machine lacks
# them) travel with the checkout in .whl/, which is git-ignored: a run must carry it
# (benchmarks/gpu_wheels.sh fetches them). In about 8 minutes at most:
#
#   1. setup: a venv over python3's packages (--system-site-packages), the carried wheels
#      (pip --no-index --no-deps), and the checkout on its path as if installed (no build:
#      benchmarks/gpu_checkout.py);
#   2. probe: CuPy, the GPU, NCCL's version, NcclCommunicator.initAll([0]), mpiexec -n 2;
#   3. tests: pytest tests/gpu, each test under a time limit, the JUnit file written even
#      when a test hangs (a worker that hangs is replaced, or a stub names the step's timeout);
#   4. the peer benchmark (benchmarks/gpu_peers.py: beside torch.distributed and bare CuPy,
#      each way doing the same work, in interleaved repeats with bootstrap intervals: per-call,
#      resnet50, multi-device, overlap), first, then the benchmarks of
#      benchmarks/gpu_compare.py: copy, devices, one-rank, two-level, torch.
#
# Every step has its own time limit, cut to what is left of the whole run's; a failing step
# does not stop the next. Everything lands in at most 4 files in OUT: summary.txt,
# results.json, junit.xml, logs.tar.gz.
#
#   bash benchmarks/gpu_run.sh [--out DIR]               # on the GPU machine (OUT=... too)
#   bash benchmarks/gpu_run.sh --cpu --fakecupy PATH     # here, under a NumPy CuPy stand-in
#
# --cpu runs the same steps on a machine without a GPU, with a NumPy stand-in for CuPy first
# on the import path (--fakecupy PATH or FAKECUPY=PATH; FAKE_GPUS devices, default 1), tiny
# benchmark sizes, and the tests that --tests names (default: all of tests/gpu,
# tests/test_call_path.py and tests/test_gpu_streams.py); its numbers mean nothing, and it says so. Other settings: PYTHON (the interpreter whose packages the
# venv sees; default python3, or .venv/bin/python in --cpu mode), WHEELS (default .whl),
# BUDGET (seconds for the whole run, default 480), WORKERS (pytest-xdist workers), COMMIT
# (the commit to name, where the checkout has no git history), PARTS (the benchmark parts to
# run, default "peers copy devices one-rank two-level torch"; "profile" adds a host-time
# profile of each compared call), STEPS (the steps before the
# benchmarks, default "tests": "none" leaves the tests out).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=gpu
# (the path test's CuPy cases run only where CuPy is; the stream-order record only under the
# stand-in)
TESTS="tests/gpu tests/test_call_path.py tests/test_gpu_streams.py"
FAKECUPY=${FAKECUPY:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --out) OUT=$2; shift ;;
    --fakecupy) FAKECUPY=$2; shift ;;
    --tests) TESTS=$2; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-./gpu-results}
BUDGET=${BUDGET:-480}
WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_run.XXXXXX")
LOGS=$WORK/logs
mkdir -p "$LOGS"
START=$SECONDS
QUICK=()
if [ "$MODE" = cpu ]; then
  if [ -z "$FAKECUPY" ] || [ ! -f "$FAKECUPY/cupy/__init__.py" ]; then
    echo "gpu_run.sh --cpu needs a NumPy stand-in for CuPy: --fakecupy PATH (a folder holding" \
         "cupy/), or FAKECUPY=PATH; got '${FAKECUPY}'" >&2
    exit 2
  fi
  FAKECUPY=$(cd "$FAKECUPY" && pwd)
  export PYTHONPATH=$FAKECUPY${PYTHONPATH:+:$PYTHONPATH}
  export FAKE_GPUS=${FAKE_GPUS:-1} FAKE_STRICT=${FAKE_STRICT:-1} FAKE_REPORT=1
  PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo "$ROOT/.venv/bin/python" || echo python3 )}
  QUICK=(--quick)
  # here the carried wheels are another Python's: the interpreter's own MPICH (a venv's mpich
  # wheel keeps libmpi in the venv's lib/, where the new venv's mpi4py does not look)
  parent_lib=$(cd "$(dirname "$PYTHON")/.." && pwd)/lib
  [ -e "$parent_lib/libmpi.so.12" ] && export MPI4PY_LIBMPI=${MPI4PY_LIBMPI:-$parent_lib}
else
  PYTHON=${PYTHON:-python3}
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export COLLECTIVES_GPU_RUN=1  # (the tests' own dry run of this script need not run inside it)

log() { echo "[gpu_run $(date -u +%H:%M:%S) +$((SECONDS - START))s] $*" | tee -a "$LOGS/run.log"; }

step() {  # step NAME LIMIT COMMAND...: in a process group of its own, output to logs/NAME.log
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - 20 - (SECONDS - START)))  # 20 s stay for packing
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    log "skip $name: the run's ${BUDGET}s are spent"
    printf '%s\t%s\t%s\t%s\n' "$name" 124 0 0 >> "$WORK/steps.tsv"
    return 124
  fi
  log "start $name (limit ${limit}s)"
  local t0=$SECONDS
  # a process group of its own where setsid exists (util-linux), so what the step leaves
  # behind (mpiexec ranks, say) goes with it; without setsid the step still runs
  local group=()
  command -v setsid > /dev/null && group=(setsid)
  ${group[@]+"${group[@]}"} timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1 &
  local pid=$!
  wait "$pid"
  local rc=$?
  [ ${#group[@]} -gt 0 ] && kill -KILL -- "-$pid" 2>/dev/null
  log "end $name: exit $rc after $((SECONDS - t0))s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$WORK/steps.tsv"
  return $rc
}

log "mode $MODE, checkout ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, work $WORK"
{ nvidia-smi && nvidia-smi topo -m; } > "$LOGS/nvidia-smi.txt" 2>&1 \
  || echo "nvidia-smi is not available on this machine" >> "$LOGS/nvidia-smi.txt"
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$DEVICE" ] || DEVICE="no GPU (nvidia-smi found none)"
[ "$MODE" = cpu ] && DEVICE="CPU, NumPy CuPy stand-in with $FAKE_GPUS device(s)"

# --- 1. setup -------------------------------------------------------------------------------
VENV=$WORK/venv
setup() {
  "$PYTHON" -m venv --system-site-packages "$VENV" \
    || "$PYTHON" -m venv --system-site-packages --without-pip "$VENV" || return 1
  local py=$VENV/bin/python
  local site
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  # the packages of the interpreter that made the venv, where it is a venv itself
  "$PYTHON" - "$site" <<'EOF' || return 1
import site, sys
if sys.prefix != sys.base_prefix:
    with open(sys.argv[1] + "/zz-parent-packages.pth", "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
EOF
  local wheel module
  for wheel in "$WHEELS"/*.whl; do
    [ -e "$wheel" ] || { echo "no wheels in $WHEELS (bash benchmarks/gpu_wheels.sh)"; break; }
    # MPI always (the machine's mpi4py has no MPI library); the rest only where it is missing
    case "$(basename "$wheel")" in
      ml_dtypes-*) module=ml_dtypes ;;
      pytest_xdist-*) module=xdist ;;
      execnet-*) module=execnet ;;
      *) module= ;;
    esac
    if [ -n "$module" ] && "$py" -c "import $module" 2>/dev/null; then
      echo "$module: the interpreter's own"
      continue
    fi
    "$py" -m pip install --quiet --no-index --no-deps --ignore-installed "$wheel" \
      || echo "not installed: $wheel (another Python's wheel?); the interpreter's own is used"
  done
  "$py" benchmarks/gpu_checkout.py "$site" || return 1  # the checkout, as installed
  "$py" -c 'import collectives, collectives.backends.cupy, collectives.backends.nccl; print("collectives", collectives.__version__, "from", collectives.__file__)'
}
export ROOT PYTHON WHEELS VENV WORK
export -f setup
step setup 60 bash -c setup
PY=$VENV/bin/python
MPIEXEC=$VENV/bin/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=$(dirname "$PYTHON")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec || echo "$VENV/bin/mpiexec")
[ -x "$MPIEXEC" ] || log "no mpiexec (carry the MPICH wheel in $WHEELS): the MPI steps fail"
# the tests launch ranks with the mpiexec beside their Python or on PATH: the same one as here
PATH=$(dirname "$MPIEXEC"):$PATH
export PY MPIEXEC PATH

# --- 2. probe -------------------------------------------------------------------------------
probe() {
  "$PY" - "$WORK/probe.json" <<'EOF'
import json, platform, sys
facts, problems = {"python": platform.python_version()}, []
try:
    import numpy, cupy
    facts.update(numpy=numpy.__version__, cupy=cupy.__version__)
    from collectives.backends.cupy import probe
    facts["describe"] = probe.describe()
    probe.require_gpu()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    facts.update(devices=cupy.cuda.runtime.getDeviceCount(),
                 device=name.decode() if isinstance(name, bytes) else str(name),
                 memory_mib=int(props["totalGlobalMem"]) >> 20,
                 cuda_runtime=cupy.cuda.runtime.runtimeGetVersion()
                 if hasattr(cupy.cuda.runtime, "runtimeGetVersion") else None)
    nccl = probe.nccl_module()
    facts["nccl"] = int(nccl.get_version())
    (comm,) = nccl.NcclCommunicator.initAll([0])
    x = cupy.arange(4, dtype=cupy.float32)
    y = cupy.empty_like(x)
    comm.allReduce(x.data.ptr, y.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                   cupy.cuda.get_current_stream().ptr)
    assert cupy.asnumpy(y).tolist() == [0, 1, 2, 3], cupy.asnumpy(y)
    facts["initAll([0])"] = "ok: a one-device allReduce ran"
except Exception as exc:  # noqa: BLE001 - the probe reports, it does not stop the run
    problems.append(f"{type(exc).__name__}: {exc}")
try:
    import torch
    facts["torch"] = f"{torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'}"
except ImportError:
    facts["torch"] = "not installed"
facts["problems"] = problems
facts["summary"] = (f"CuPy {facts.get('cupy', '-')}, NCCL {facts.get('nccl', '-')}, "
                    f"{facts.get('device', 'no GPU')}, torch {facts['torch']}; "
                    + ("; ".join(problems) if problems else "all found"))
json.dump(facts, open(sys.argv[1], "w"), indent=1)
print(json.dumps(facts, indent=1))
sys.exit(1 if problems else 0)
EOF
  local rc=$?
  echo "--- mpiexec -n 2 ($MPIEXEC)"
  timeout 30 "$MPIEXEC" -n 2 "$PY" -c 'from mpi4py import MPI; c = MPI.COMM_WORLD; v = c.allreduce(c.rank + 1); print(f"rank {c.rank} of {c.size}: sum {v}; {MPI.Get_library_version().splitlines()[0]}")' \
    || { echo "mpiexec -n 2 failed"; rc=1; }
  return $rc
}
export -f probe
step probe 60 bash -c probe

# --- 3. tests -------------------------------------------------------------------------------
# -v: each test's outcome is in the log as it finishes, so a run stopped at the step's limit
# still says which tests passed (the JUnit file is only written at the end)
# (-o addopts=: this script picks the workers itself, with or without pytest-xdist)
PYTEST=(-o addopts= -v -rs -p no:cacheprovider --durations=15 --junitxml "$WORK/junit.xml"
        --timeout 150)
if "$PY" -c 'import xdist' 2>/dev/null && [ "$(nproc)" -ge 4 ]; then
  WORKERS=${WORKERS:-$(( $(nproc) / 2 > 8 ? 8 : $(nproc) / 2 ))}
  # a worker whose test hangs is ended and replaced; the controller still writes the JUnit
  PYTEST+=(-n "$WORKERS" --timeout-method=thread)
else
  PYTEST+=(--timeout-method=signal)  # the hung test fails, and pytest goes on
fi
read -r -a SELECTED <<< "$TESTS"
# the peer benchmark first (what earlier cards never measured), then the tests
COMPARE=("$PY" benchmarks/gpu_compare.py)
PARTS=" ${PARTS:-peers copy devices one-rank two-level torch} "
wanted() { [[ "$PARTS" == *" $1 "* ]]; }
if wanted peers; then
  for part in per-call:60 resnet50:60 multi-device:80 overlap:40; do
    step "peers-${part%%:*}" "${part##*:}" "$PY" benchmarks/gpu_peers.py "${part%%:*}" \
      --out "$WORK" "${QUICK[@]}"
  done
fi
if [ "${STEPS:-tests}" != none ]; then  # (none: no JUnit file; the summary says so)
step tests 240 "$PY" -m pytest "${PYTEST[@]}" "${SELECTED[@]}"
if [ ! -s "$WORK/junit.xml" ]; then  # pytest itself was stopped: say so in the JUnit file
  "$PY" benchmarks/gpu_summary.py --junit-from-log "$LOGS/tests.log" "$WORK/junit.xml" \
    || python3 benchmarks/gpu_summary.py --junit-from-log "$LOGS/tests.log" "$WORK/junit.xml"
fi
if [ ! -s "$WORK/junit.xml" ]; then
  cat > "$WORK/junit.xml" <<EOF
<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="1" failures="0" errors="1" skipped="0">
<testcase classname="gpu_run" name="tests"><error message="pytest did not finish within the step's time limit; see logs/tests.log"/></testcase>
</testsuite></testsuites>
EOF
fi
fi

# --- 4. benchmarks --------------------------------------------------------------------------
wanted copy && step copy 25 "${COMPARE[@]}" copy --out "$WORK" "${QUICK[@]}"
wanted devices && step devices 80 "${COMPARE[@]}" devices --out "$WORK" "${QUICK[@]}"
wanted one-rank && step one-rank 35 "${COMPARE[@]}" one-rank --out "$WORK" "${QUICK[@]}"
wanted two-level && step two-level 45 env COLLECTIVES_RANKS_PER_NODE=1 "$MPIEXEC" -n 2 \
  "${COMPARE[@]}" two-level --out "$WORK" "${QUICK[@]}"
wanted torch && step torch 25 "${COMPARE[@]}" torch --out "$WORK" "${QUICK[@]}"
# (not among the default parts: where the host time of each compared call goes, as text in
# logs/profile.log)
wanted profile && step profile 90 "$PY" benchmarks/gpu_profile.py "${QUICK[@]}"

# --- packing: at most 4 files ---------------------------------------------------------------
"$PY" - "$WORK/run.json" "$MODE" "$DEVICE" <<'EOF'
import datetime, json, subprocess, sys
import os
try:  # COMMIT names it where the copy of the checkout has no git history
    commit = os.environ.get("COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = ""
json.dump({"mode": sys.argv[2], "device": sys.argv[3], "commit": commit or "unknown",
           "command": "bash benchmarks/gpu_run.sh" + (" --cpu" if sys.argv[2] == "cpu" else ""),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
          open(sys.argv[1], "w"))
EOF
"$PY" benchmarks/gpu_summary.py "$WORK" "$OUT" > "$LOGS/summary.log" 2>&1 \
  || python3 benchmarks/gpu_summary.py "$WORK" "$OUT" >> "$LOGS/summary.log" 2>&1
[ -s "$WORK/junit.xml" ] && cp "$WORK/junit.xml" "$OUT/junit.xml"
cp "$WORK"/gpu_compare_*.json "$WORK"/gpu_peers_*.json "$WORK/probe.json" "$WORK/steps.tsv" "$LOGS/" 2>/dev/null
log "done after $((SECONDS - START))s; results in $OUT"
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs
cat "$OUT/summary.txt" 2>/dev/null || cat "$LOGS/summary.log"
rm -rf "$WORK"
