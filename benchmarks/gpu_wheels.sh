#!/usr/bin/env bash
# Fetch what the GPU run needs and a GPU machine without network lacks: the MPICH and mpi4py
# wheels for CPython 3.12 on manylinux x86-64, into the git-ignored folder .whl/ (about 15 MB;
# everything a run carries must stay well under 64 MiB). Run it on a machine that reaches the
# package index, then carry .whl/ with the checkout; benchmarks/gpu_run.sh installs from it
# with --no-index.
#
#   bash benchmarks/gpu_wheels.sh            # WHEELS=/some/dir to put them elsewhere
#
# The versions are the ones the mpi extra resolves to today (pyproject.toml: mpi4py>=4.0,
# mpich>=4.2); MPI4PY and MPICH override them.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
MPI4PY=${MPI4PY:-4.1.2}
MPICH=${MPICH:-5.0.2}
mkdir -p "$WHEELS"
rm -f "$WHEELS"/*.whl
# --no-deps: the two wheels are the whole MPI stack (mpi4py finds MPICH's library in the
# mpich wheel); the GPU machine has NumPy, CuPy and NCCL of its own.
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  "mpi4py==$MPI4PY" "mpich==$MPICH"
ls -l "$WHEELS"
total=$(du -sk "$WHEELS" | cut -f1)
echo "$WHEELS: $(ls "$WHEELS"/*.whl | wc -l) wheels, ${total} KiB"
if [ "$total" -gt $((32 * 1024)) ]; then
  echo "$WHEELS holds more than 32 MiB: a GPU run carries 64 MiB in all" >&2
  exit 1
fi
