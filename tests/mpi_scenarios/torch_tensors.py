"""PyTorch CPU tensors through every collective on MPI ranks (``py``): for each
dtype, every call on NumPy arrays and on tensors of the same values, compared on every rank:
tensors come back, bitwise NumPy's results, which equal the float64 reference (so every rank
holds the same bits), and the inputs are untouched.

Run as ``.venv/bin/mpiexec -n 3 .venv/bin/python tests/mpi_scenarios/torch_tensors.py``.
"""

from __future__ import annotations

from _common import Report
from collectives.backends import mpi
from torch_body import DTYPES, as_tensor, compare, inputs_of, numpy_dtype, run_both

report = Report("torch_tensors")
comm = mpi.init(timeout=60)
n, rank = comm.size, comm.rank
for name in DTYPES:
    dtype = numpy_dtype(name)
    if dtype is None:  # (bfloat16 without ml_dtypes)
        continue
    inputs = inputs_of(n, dtype)
    tensors = {key: as_tensor(v[rank]) for key, v in inputs.items()}
    before = {key: t.clone() for key, t in tensors.items()}
    by_numpy, by_torch = run_both(comm, inputs, tensors)
    wrong = compare(by_numpy, by_torch, inputs, tensors, before, n, rank)
    report.check(not wrong, f"{name}: " + "; ".join(wrong[:5]))
comm.free()
report.finish(f"dtypes={len(DTYPES)}")
