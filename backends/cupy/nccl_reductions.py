"""How a dtype and op travel through NCCL, if they can (shared by both GPU backends).

NCCL has no bool, int16, uint16 or complex types, and its float MAX/MIN may drop NaN. So:

* complex SUM travels as twice as many floats (the same additions, element by element);
* bool MAX/MIN travels as uint8 MAX/MIN (bools are the bytes 0 and 1);
* float32/float64 MAX/MIN travel as integer keys whose order is the floats' order, with NaN
  ranked first (``kernels.key_kernels``): integer MAX/MIN cannot drop a NaN;
* bfloat16 SUM/PROD travel as NCCL's bfloat16;
* float16 and bfloat16 MAX/MIN, int16, uint16 and complex PROD have no exact NCCL form: the
  library's own algorithms run them;
* MEAN travels as SUM and is divided once afterwards (NCCL's AVG divides before summing,
  and divides integers in integers);
* broadcast and all-gather move bytes, so every dtype goes as uint8.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from collectives.ops import BFLOAT16, ReduceOp


@dataclass(frozen=True)
class Reduction:
    """A reduction as NCCL runs it: on ``view`` (a same-width view of the data, with
    ``scale`` of its elements per element), NCCL type and op codes, and whether the data
    travel as order-preserving integer keys."""

    view: np.dtype
    nccl_type: int
    nccl_op: int
    scale: int = 1
    keys: bool = False


def _types(nccl) -> dict[np.dtype, int]:
    types: dict[np.dtype, int] = {
        np.dtype(np.int8): nccl.NCCL_INT8, np.dtype(np.uint8): nccl.NCCL_UINT8,
        np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.uint32): nccl.NCCL_UINT32,
        np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint64): nccl.NCCL_UINT64,
        np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.float32): nccl.NCCL_FLOAT32,
        np.dtype(np.float64): nccl.NCCL_FLOAT64}
    if BFLOAT16 is not None and hasattr(nccl, "NCCL_BFLOAT16"):  # NCCL >= 2.10
        types[BFLOAT16] = nccl.NCCL_BFLOAT16
    return types


def _ops(nccl) -> dict[ReduceOp, int]:
    return {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.PROD: nccl.NCCL_PROD,
            ReduceOp.MAX: nccl.NCCL_MAX, ReduceOp.MIN: nccl.NCCL_MIN}


def reduction(nccl, dtype: np.dtype, op: ReduceOp) -> Reduction | None:
    """How NCCL reduces ``dtype`` with ``op`` bit-exactly, or None where it cannot (worked out
    once per dtype and op: every NCCL call asks)."""
    return _reduction(nccl, np.dtype(dtype), op)


@lru_cache(maxsize=512)
def _reduction(nccl, dtype: np.dtype, op: ReduceOp) -> Reduction | None:
    wire = op.wire_op
    if not dtype.isnative:
        return None
    types, ops = _types(nccl), _ops(nccl)
    if dtype.kind == "c":
        if wire is not ReduceOp.SUM:
            return None
        part = np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
        return Reduction(part, types[part], ops[wire], scale=2)
    if dtype.kind == "b":
        if wire not in (ReduceOp.MAX, ReduceOp.MIN):
            return None
        return Reduction(np.dtype(np.uint8), types[np.dtype(np.uint8)], ops[wire])
    floating = dtype.kind == "f" or (BFLOAT16 is not None and dtype == BFLOAT16)
    if floating and wire in (ReduceOp.MAX, ReduceOp.MIN):
        if dtype not in (np.float32, np.float64):
            return None  # float16, bfloat16: no 16-bit integer type in NCCL for their keys
        key = np.dtype(np.int32 if dtype == np.float32 else np.int64)
        return Reduction(key, types[key], ops[wire], keys=True)
    if dtype not in types:
        return None
    return Reduction(dtype, types[dtype], ops[wire])


def byte_type(nccl) -> int:
    """NCCL's type for moving raw bytes (broadcast, all-gather, point-to-point)."""
    return nccl.NCCL_UINT8


def describe_unsupported(dtype: np.dtype, op: ReduceOp | None) -> str:
    """Why NCCL does not run this reduction (for logs and docs)."""
    what = f"{np.dtype(dtype)} {op.value}" if op is not None else str(np.dtype(dtype))
    return f"NCCL has no exact form of {what}; the library's own algorithms run it"
