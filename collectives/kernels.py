"""Combines in one pass: ``dst = op(first, srcs[0], srcs[1], ...)``, left to right.

NumPy offers only binary ufuncs, so reducing ``k + 1`` arrays with them makes ``k`` passes
over the destination, each reading and writing it. The compiled kernels (``_kernels.c``,
built with the package where a C compiler is present) read every operand once and write the
destination once, through an accumulator block that stays in L1, with the GIL released, and
in exactly the order of the binary passes, so their results are bitwise NumPy's (but for the
sign of a NaN born of ``inf + -inf``, and which operand's payload a sum or product of NaNs
keeps, which the IEEE standard leaves open: NumPy's own choice differs between its vector
loop and its tail; a NaN stays a NaN, on every rank alike).

They cover SUM (and MEAN, which travels as SUM) and PROD on float32, float64, every integer
type and the narrow floats of wire compression (bfloat16; float16 where the CPU converts
halves), and MAX and MIN on integers, for C-contiguous operands. Everything else, and
everything when the extension is not built, runs NumPy's ufuncs left to right, over blocks of
at most ``BLOCK_BYTES`` per operand so the partial result stays in cache between the passes.
``cast_into`` casts between float32/float64 and the narrow floats the same way (NumPy's and
ml_dtypes' casts are element by element in software, ten times slower).
``COMPILED`` says which is in use; ``compiled=False`` forces NumPy's (tests compare the two).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .ops import BFLOAT16, ReduceOp, kernel_name

try:
    from . import _kernels as _compiled
except ImportError:  # pragma: no cover - built without a C compiler: NumPy's ufuncs
    _compiled = None

__all__ = ["BLOCK_BYTES", "COMPILED", "cast_into", "combine", "combine_into", "compiled_covers"]

COMPILED = _compiled is not None
BLOCK_BYTES = 256 << 10  # per operand: a block of the result and of a few sources fit in L2

# The compiled kernels' codes (the order of ITEMSIZE and KERNELS in _kernels.c), by NumPy
# dtype; looked up with whatever an array gives as its dtype (None: none).
_TYPES: dict[Any, int] = {np.dtype(name): code for code, name in enumerate(
    ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
     "uint64", "float16"))}
if BFLOAT16 is not None:
    _TYPES[BFLOAT16] = 11
_INTEGERS = range(2, 10)  # the codes MAX and MIN cover
_OPS = {ReduceOp.SUM: 0, ReduceOp.MEAN: 0, ReduceOp.PROD: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3}
_UFUNCS = {op: getattr(np, kernel_name(op)) for op in ReduceOp}


def compiled_covers(op: ReduceOp, dtype: np.dtype) -> bool:
    """Whether the compiled kernels (if built) combine ``dtype`` with ``op``."""
    code = _TYPES.get(np.dtype(dtype))
    if code == 10 and not (_compiled is not None and _compiled.HALF):
        return False
    if code in _INTEGERS and not (_compiled is not None and _compiled.INTEGERS):
        return False  # _integer_kernels, an extension of its own, was not built
    return code is not None and (_OPS[op] < 2 or code in _INTEGERS)


def combine_into(op: ReduceOp, dst: Any, first: Any, srcs: Sequence[Any], *,
                 compiled: bool = True) -> None:
    """``dst = op(first, srcs[0], srcs[1], ...)``, left to right; ``first`` may be ``dst``."""
    if not srcs:
        if first is not dst:
            np.copyto(dst, first)
        return
    if compiled and _compiled is not None:
        dtype = dst.dtype
        code = _TYPES.get(dtype)
        # (the kernels read every operand as dst's type: mixed dtypes are NumPy's to cast)
        if (code is not None and getattr(first, "dtype", None) == dtype
                and all(getattr(s, "dtype", None) == dtype for s in srcs)
                and _compiled.combine(_OPS[op], code, dst, first, tuple(srcs))):
            return
    ufunc = _UFUNCS[op]
    step = max(1, BLOCK_BYTES // max(dst.itemsize, 1))
    if dst.ndim != 1 or len(srcs) == 1 or len(dst) <= step:
        ufunc(first, srcs[0], out=dst)
        for src in srcs[1:]:
            ufunc(dst, src, out=dst)
        return
    for a in range(0, len(dst), step):
        b = a + step
        block = dst[a:b]
        ufunc(first[a:b], srcs[0][a:b], out=block)
        for src in srcs[1:]:
            ufunc(block, src[a:b], out=block)


def combine(op: ReduceOp, dst: Any, srcs: Sequence[Any], *, compiled: bool = True) -> None:
    """``dst = op(dst, srcs[0], srcs[1], ...)``, left to right."""
    combine_into(op, dst, dst, srcs, compiled=compiled)


def cast_into(dst: Any, src: Any, *, compiled: bool = True) -> None:
    """``dst[...] = src`` with NumPy's unsafe casting; between float32/float64 and float16/
    bfloat16 by the compiled casts where built (bitwise NumPy's and ml_dtypes' values)."""
    if compiled and _compiled is not None:
        to, of = _TYPES.get(dst.dtype), _TYPES.get(getattr(src, "dtype", None))
        if to is not None and of is not None and _compiled.convert(to, of, dst, src):
            return
    np.copyto(dst, src, casting="unsafe")
