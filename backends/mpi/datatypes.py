"""Which dtypes and ops MPI reduces itself, as ``(MPI datatype, MPI op)``.

None means MPI does not define the pair and the call runs one of the core's schedules:
float16 and bfloat16 (the standard has no 16-bit float; MPICH's ``MPIX_C_FLOAT16`` is an
extension not relied on), byte-swapped dtypes, MAX/MIN of complex numbers, and PROD of
complex numbers (MPICH multiplies as C99's Annex G does, which makes ``inf`` of a NaN times
an infinity, where NumPy, the schedules and the reference keep the NaN). Booleans reduce
MAX/MIN as MPI's logical OR/AND. Broadcasts and gathers need no datatype: they move bytes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from mpi4py import MPI

from collectives.ops import ReduceOp

_TYPES = {
    ("i", 1): MPI.INT8_T, ("i", 2): MPI.INT16_T, ("i", 4): MPI.INT32_T, ("i", 8): MPI.INT64_T,
    ("u", 1): MPI.UINT8_T, ("u", 2): MPI.UINT16_T, ("u", 4): MPI.UINT32_T, ("u", 8): MPI.UINT64_T,
    ("f", 4): MPI.FLOAT, ("f", 8): MPI.DOUBLE,
    ("c", 8): MPI.C_FLOAT_COMPLEX, ("c", 16): MPI.C_DOUBLE_COMPLEX,
}
_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.PROD: MPI.PROD, ReduceOp.MAX: MPI.MAX,
        ReduceOp.MIN: MPI.MIN}


@lru_cache(maxsize=256)
def native_types(dtype: np.dtype, op: ReduceOp | None) -> tuple | None:
    """``(datatype, op)`` for MPI's reductions of ``dtype`` by ``op`` (MEAN moves as SUM), or
    None where MPI has no such reduction."""
    dtype = np.dtype(dtype)
    if op is None or not dtype.isnative or dtype.fields is not None:
        return None
    op = op.wire_op
    if dtype.kind == "b":
        logical = {ReduceOp.MAX: MPI.LOR, ReduceOp.MIN: MPI.LAND}.get(op)
        return (MPI.C_BOOL, logical) if logical is not None else None
    if dtype.kind == "c" and op in (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PROD):
        return None
    if dtype.kind not in "iufc" or dtype.type.__module__ != "numpy":
        return None  # bfloat16 and other extension types share kinds with NumPy's
    datatype = _TYPES.get((dtype.kind, dtype.itemsize))
    if datatype is None or datatype == MPI.DATATYPE_NULL:
        return None
    return datatype, _OPS[op]


def has_nan_issue(dtype: np.dtype, op: ReduceOp) -> bool:
    """MPI's MAX and MIN of floats may drop a NaN (``a > b ? a : b``, depending on order)."""
    return op.wire_op in (ReduceOp.MAX, ReduceOp.MIN) and np.dtype(dtype).kind == "f"
