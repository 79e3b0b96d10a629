"""The check value riding in a small all-reduce itself: a few extra elements of the same
reduction, chosen so that they stay exact and show whether every rank had the same check.

The 30-bit check value is cut into pieces ``v`` of ``bits`` bits each, and each piece travels
as two elements:

* MAX and MIN (booleans: OR and AND): ``v`` and ``K - v`` (``K = 2**bits - 1``). Every rank
  holding the same ``v`` is exactly ``max(v) == v`` and ``max(K - v) == K - v``;
* SUM: ``v`` and ``v * v``, small enough that ``size * K * K`` is exact in the dtype. Every
  rank holding the same ``v`` is exactly ``sum(v) == size * v`` and
  ``sum(v * v) == size * v * v`` (by Cauchy-Schwarz, equality holds only when all are equal).

So every rank knows the reduced trailer it must see if all agree (its own, reduced as if every
rank held it) and compares bytes: one comparison, no decoding. Floats of MAX and MIN add one
element, a NaN flag (MPI's MAX and MIN may drop NaN: see ``checks.py``). PROD, and dtypes
too narrow for the ranks' count, have no rider: their calls use a separate check all-reduce.
"""

from __future__ import annotations

import numpy as np

from collectives.ops import ReduceOp

CHECK_BITS = 30


def _mantissa(dtype: np.dtype) -> int:
    """Bits of an integer this dtype holds exactly (complex: per component)."""
    if dtype.kind == "b":
        return 1
    if dtype.kind in "fc":
        return {4: 24, 8: 53, 16: 53}[dtype.itemsize // (2 if dtype.kind == "c" else 1)]
    return dtype.itemsize * 8 - (dtype.kind == "i")


class Rider:
    """The trailer of one call: ``length`` extra elements of ``dtype``."""

    __slots__ = ("expected", "length", "mine", "nan")

    def __init__(self, mine: np.ndarray, expected: np.ndarray, nan: int):
        self.mine, self.expected, self.nan = mine, expected.tobytes(), nan
        self.length = len(mine) + (nan != 0)

    @classmethod
    def make(cls, dtype: np.dtype, op: ReduceOp, size: int, check: int) -> Rider | None:
        """The rider of an all-reduce of ``dtype`` by ``op`` over ``size`` ranks (None where
        no exact one exists)."""
        op, dtype = op.wire_op, np.dtype(dtype)
        room = _mantissa(dtype)
        if op in (ReduceOp.MAX, ReduceOp.MIN) and dtype.kind in "biuf":
            bits = min(room, 15)
        elif op is ReduceOp.SUM and dtype.kind in "iufc":
            bits = min((room - size.bit_length()) // 2, 15)
        else:
            return None
        if bits < 1:
            return None
        k = (1 << bits) - 1
        pieces = [(check >> s) & k for s in range(0, CHECK_BITS, bits)]
        if op is ReduceOp.SUM:
            mine = [x for v in pieces for x in (v, v * v)]
            expected = [size * x for x in mine]
        else:
            mine = [x for v in pieces for x in (v, k - v)]
            expected = mine
        nan = 0
        if dtype.kind == "f" and op in (ReduceOp.MAX, ReduceOp.MIN):
            nan = 1 if op is ReduceOp.MAX else -1
        return cls(np.array(mine).astype(dtype), np.array(expected).astype(dtype), nan)

    def fill(self, trailer: np.ndarray, nan: bool) -> None:
        """This rank's trailer (``nan``: its input holds a NaN)."""
        n = len(self.mine)
        trailer[:n] = self.mine
        if self.nan:
            trailer[n] = self.nan if nan else 0

    def agrees(self, trailer: np.ndarray) -> bool:
        """Whether the reduced trailer says every rank had this check value."""
        return trailer[:len(self.mine)].tobytes() == self.expected

    def any_nan(self, trailer: np.ndarray) -> bool:
        return bool(self.nan) and trailer[len(self.mine)] != 0
