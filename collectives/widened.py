"""Integer MEAN, summed in float64: an integer mean's contributions travel as float64 copies.

Summed in their own dtype, integers wrap where their mean does not (two ranks' uint8 200s
summed to 144, a mean of 72.0; two int32 1.5e9s to -647483648.0), while the float64 result
claimed a precision it did not have. So, as ``numpy.mean`` sums integers in float64, every
call kind widens an integer MEAN's input at the edge, into a new float64 array (the input is
never written), and reduces that: the result is the float64 reference's, exact while the sums
stay below 2**53 (int32 inputs on fewer than 2**21 participants), and beyond rounded as a
float64 SUM is, in the algorithm's order of additions (NumPy's may differ in the last bit;
every rank's is the same). The wire carries eight
bytes an element. The ranks agree on the dtype each passed (``Call.passed``), and errors name
it: ranks passing int32 and int64 disagree, as for any other op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ops import ReduceOp

FLOAT64 = np.dtype(np.float64)


def integer_mean(op: Any, dtype: Any) -> bool:
    """Whether ``op`` is MEAN and ``dtype`` an integer one (a bad op is not: it is refused
    where the call is checked)."""
    try:
        parsed = ReduceOp.parse(op)
    except (TypeError, ValueError):
        return False
    return parsed is ReduceOp.MEAN and np.dtype(dtype).kind in "iu"


def widened_values(arrays: Any, values: list, shape: tuple, dtype: Any, op: Any) -> tuple:
    """A multi-device call's checked ``(values, shape, dtype, op)``, an integer MEAN's values
    as float64 copies (``arrays``: their backend)."""
    if op is None or not integer_mean(op, dtype):
        return values, shape, dtype, op
    return [widened(arrays, v, op) for v in values], shape, FLOAT64, op


def widened(arrays: Any, x: Any, op: Any) -> Any:
    """``x``, or for an integer MEAN a new float64 copy of it (``arrays``: ``x``'s backend)."""
    if not integer_mean(op, x.dtype):
        return x
    wide = arrays.empty(tuple(x.shape), FLOAT64, like=x)
    arrays.copy(wide, x)
    return wide
