"""The ``*_init`` methods of :class:`~collectives.Communicator`: prepared collectives.

Each validates its call and buffers once and returns a
:class:`~collectives.runtime.prepared.PreparedCall`. ``x`` must be C-contiguous (it is read in place at
every ``start()``); ``out`` is required, and is either ``x`` itself (in place) or shares no
memory with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..arrays import overlaps
from ..ops import ReduceOp
from ..runtime.prepared import PreparedCall
from ..runtime.validate import check_out


class PreparedOps:
    """all_reduce_init, reduce_init, broadcast_init, all_gather_init, reduce_scatter_init."""

    def _bind(self, x: Any, out: Any, shape: tuple, dtype: np.dtype, what: str,
              out_argument: str = "out"):
        """``x`` as an array, and ``out`` (named ``out_argument`` in errors) checked."""
        arrays = self.arrays
        xa = self.adapt(x, "x")
        if not arrays.contiguous(xa):
            raise ValueError(f"{what}: x must be C-contiguous (a prepared call reads it in "
                             "place at every start)")
        if out is None:
            raise TypeError(f"{what}: out is required (a prepared call writes its result there "
                            "every time)")
        check_out(out, shape, dtype, out_argument, arrays)
        if out is not xa and overlaps(arrays, out, xa):
            raise ValueError(f"{what}: out overlaps x; pass x itself (in place) or a separate "
                             "array")
        return xa

    def all_reduce_init(self, x: Any, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
                        out: Any, shards: int = 0, groups: Any = None) -> PreparedCall:
        """A prepared all-reduce of ``x`` into ``out`` (which may be ``x``)."""
        xa = self.adapt(x, "x")
        call = self._call(Collective.ALL_REDUCE, xa, op, algorithm, shards=shards, groups=groups)
        xa = self._bind(xa, out, call.shape, call.final, "all_reduce_init")
        arrays = self.arrays
        work = out if call.final == call.dtype else arrays.empty(call.shape, call.dtype, like=xa)

        def finish():
            if call.op is ReduceOp.MEAN:
                arrays.divide(work, self.size, out=out)
            return out

        src = None if xa is work else arrays.flat(xa)
        return PreparedCall(self, "all_reduce", call, src, work.reshape(-1), finish)

    def reduce_init(self, x: Any, op: ReduceOp | str = "sum", root: int = 0,
                    algorithm: Any = "auto", *, out: Any = None, shards: int = 0) -> PreparedCall:
        """A prepared reduce onto ``root``; ``out`` is required there (ignored elsewhere)."""
        xa = self.adapt(x, "x")
        call = self._call(Collective.REDUCE, xa, op, algorithm, root=root, shards=shards)
        arrays = self.arrays
        mine = self.rank == call.root
        if mine:
            xa = self._bind(xa, out, call.shape, call.final, "reduce_init")
        work = arrays.empty(call.shape, call.dtype, like=xa)

        def finish():
            if not mine:
                return None
            if call.op is ReduceOp.MEAN:
                arrays.divide(work, self.size, out=out)
            else:
                arrays.copy(out, work)
            return out

        return PreparedCall(self, "reduce", call, arrays.flat(xa), work.reshape(-1), finish)

    def broadcast_init(self, x: Any, root: int = 0, algorithm: Any = "auto") -> PreparedCall:
        """A prepared broadcast of root's ``x`` into every rank's ``x`` (same shape and dtype
        on every rank)."""
        xa = self.adapt(x, "x")
        call = self._call(Collective.BROADCAST, xa, None, algorithm, root=root)
        xa = self._bind(xa, xa, call.shape, call.dtype, "broadcast_init", out_argument="x")
        return PreparedCall(self, "broadcast", call, None, xa.reshape(-1), lambda: xa)

    def all_gather_init(self, x: Any, algorithm: Any = "auto", *, out: Any) -> PreparedCall:
        """A prepared all-gather along the leading axis into ``out``."""
        xa = self.adapt(x, "x")
        call = self._call(Collective.ALL_GATHER, xa, None, algorithm, axis=0)
        base = call.shape if call.shape else (1,)
        gathered = (base[0] * self.size, *base[1:])
        xa = self._bind(xa, out, gathered, call.dtype, "all_gather_init")
        arrays, count = self.arrays, call.count
        flat_out = out.reshape(-1)
        mine = flat_out[self.rank * count:(self.rank + 1) * count]
        src = arrays.flat(xa)
        return PreparedCall(self, "all_gather", call, None, flat_out, lambda: out,
                            granule=count if count else 1, place=lambda: arrays.copy(mine, src))

    def reduce_scatter_init(self, x: Any, op: ReduceOp | str = "sum", algorithm: Any = "auto",
                            *, out: Any, shards: int = 0) -> PreparedCall:
        """A prepared reduce-scatter: ``out`` takes this rank's rows of the total."""
        xa = self.adapt(x, "x")
        call = self._call(Collective.REDUCE_SCATTER, xa, op, algorithm, shards=shards)
        rows, n, i = call.shape[0], self.size, self.rank
        lo, hi = i * rows // n, (i + 1) * rows // n
        xa = self._bind(xa, out, (hi - lo, *call.shape[1:]), call.final, "reduce_scatter_init")
        arrays = self.arrays
        work = arrays.empty(call.shape, call.dtype, like=xa)
        row = int(np.prod(call.shape[1:], dtype=np.int64))

        def finish():
            if call.op is ReduceOp.MEAN:
                arrays.divide(work[lo:hi], n, out=out)
            else:
                arrays.copy(out, work[lo:hi])
            return out

        return PreparedCall(self, "reduce_scatter", call, arrays.flat(xa), work.reshape(-1),
                            finish, granule=row if row else 1)

