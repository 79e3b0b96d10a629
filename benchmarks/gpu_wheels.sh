#!/usr/bin/env bash
# Fetch what the GPU run needs and a GPU machine without network may lack, as wheels for
# CPython 3.12 on manylinux x86-64, into the git-ignored folder .whl/ (about 16 MB; everything a
# run carries must stay well under 64 MiB): MPICH and mpi4py (the machine's mpi4py has no MPI
# library), and, installed there only where its Python lacks them, ml_dtypes (CuPy's bfloat16:
# without it every bfloat16 case is left out) and pytest-xdist with execnet (the tests in
# parallel: one after another they may not fit the tests' time limit). Run it on a machine
# that reaches the package index, then carry .whl/ with the checkout (it is git-ignored:
# name it among the paths a run carries); benchmarks/gpu_run.sh installs from it with
# --no-index.
#
#   bash benchmarks/gpu_wheels.sh            # WHEELS=/some/dir to put them elsewhere
#
# The versions are the ones the extras resolve to today (pyproject.toml: mpi4py>=4.0,
# mpich>=4.2, ml_dtypes>=0.3); MPI4PY, MPICH, ML_DTYPES, XDIST and EXECNET override them.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
MPI4PY=${MPI4PY:-4.1.2}
MPICH=${MPICH:-5.0.2}
ML_DTYPES=${ML_DTYPES:-0.5.4}  # (0.5 takes NumPy 2.0 and later; 0.6 wants 2.1 from Python 3.13)
XDIST=${XDIST:-3.8.0}
EXECNET=${EXECNET:-2.1.1}
mkdir -p "$WHEELS"
rm -f "$WHEELS"/*.whl
# --no-deps: the mpich and mpi4py wheels are the whole MPI stack (mpi4py finds MPICH's library
# in the mpich wheel); the GPU machine has NumPy, pytest, CuPy and NCCL of its own.
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  "mpi4py==$MPI4PY" "mpich==$MPICH" "ml_dtypes==$ML_DTYPES" "pytest-xdist==$XDIST" \
  "execnet==$EXECNET"
ls -l "$WHEELS"
total=$(du -sk "$WHEELS" | cut -f1)
echo "$WHEELS: $(ls "$WHEELS"/*.whl | wc -l) wheels, ${total} KiB"
if [ "$total" -gt $((32 * 1024)) ]; then
  echo "$WHEELS holds more than 32 MiB: a GPU run carries 64 MiB in all" >&2
  exit 1
fi
