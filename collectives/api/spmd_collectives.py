"""The five collectives of :class:`~collectives.Communicator`, argument by argument.

Each method describes its call, chooses its buffers (the user's ``out`` where it can take the
result, else a fresh result the user may keep) and hands ``Communicator._start`` a builder of
the call's data stage and of the ``finish`` that returns the result. Every method takes
``async_op=True`` to return a :class:`~collectives.Work` handle instead of the result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..arrays import overlaps
from ..compression import requested
from ..foreign import accepts_foreign, call_foreign, is_foreign
from ..ops import ReduceOp
from ..runtime.fastpath import FastAllReduce
from ..runtime.validate import valid_timeout
from .compressed import spmd_all_reduce


class CollectiveOps:
    """All-reduce, reduce, broadcast, all-gather and reduce-scatter (mixed into Communicator)."""

    def all_reduce(self, x: Any, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
                   out: Any = None, shards: int = 0, groups: Any = None,
                   timeout: float | None = None, async_op: bool = False,
                   compression: str | None = None) -> Any:
        """Reduce ``x`` over all ranks; every rank gets the (bitwise identical) result.

        ``algorithm`` takes any spec form ("ring", "nccl/xring", "xring#2", tuples, ranges).
        ``out``: where the result goes (may be ``x`` itself); else a new array.
        ``compression``: "fp16" or "bf16" carries a float32/float64 SUM or MEAN in that
        narrower float and casts the result back (see ``collectives.compression``).
        """
        fast = self._hot  # the hot path the last repeated call took
        if (fast is not None and x.__class__ is fast.cls and timeout is None and not async_op
                and not shards and groups is None and compression is None):
            if not (op is fast.op and algorithm is fast.algorithm and x.dtype is fast.dtype
                    and x.shape == fast.shape):  # (the same arguments: by identity)
                try:  # another signature's hot path, if it has one
                    fast = self._fast.get((x.shape, x.dtype, op, algorithm))
                except TypeError:  # an unhashable spec (a list of ranges): no hot path
                    fast = None
            if fast is not None and (out is None or (
                    out.__class__ is fast.cls and out.shape == fast.shape
                    and (out.dtype is fast.dtype or out.dtype == fast.dtype))):
                self._hot = fast
                result = fast(x, out)
                if result is not None:
                    return result
        return self._all_reduce(x, op, algorithm, out, shards, groups, timeout, async_op,
                                compression)

    def _all_reduce(self, x: Any, op: Any, algorithm: Any, out: Any, shards: int, groups: Any,
                    timeout: float | None, async_op: bool, compression: str | None) -> Any:
        """``all_reduce`` beyond the hot path (kept apart: its closures would make every
        argument of ``all_reduce`` a cell, which costs the hot path a few hundred ns)."""
        if is_foreign(x) or is_foreign(out):
            return call_foreign(CollectiveOps.all_reduce, self, x, (op, algorithm),
                                dict(out=out, shards=shards, groups=groups, timeout=timeout,
                                     async_op=async_op, compression=compression))
        if requested(compression):
            return spmd_all_reduce(self, x, op, algorithm, compression, out=out, shards=shards,
                                   groups=groups, timeout=timeout, async_op=async_op)
        fast_key = None
        # (with COLLECTIVES_DEBUG=detail every call is agreed and logged: no hot path; a bad
        # timeout= takes the checked path, which raises naming it)
        if (not async_op and not shards and groups is None and self.arrays.owns(x)
                and valid_timeout(timeout)):
            fast_key = (x.shape, x.dtype, op, algorithm)
            try:
                fast = self._fast.get(fast_key)
            except TypeError:  # an unhashable spec (a list of ranges): no hot path
                fast_key = fast = None
            if fast is not None and (out is None or self._fits(out, x)):
                self._hot = fast
                result = fast(x, out, timeout)
                if result is not None:
                    return result
        seen: list = []

        def build(seq):
            arrays = self.arrays
            xa = self.adapt(x, "x")
            call = self._call(Collective.ALL_REDUCE, xa, op, algorithm, shards=shards,
                              groups=groups)
            seen.append(call)
            target, late = self._target(out, call.shape, call.final)
            same = call.final == call.dtype
            if target is not None and same and (target is xa or not overlaps(arrays, target, xa)):
                work = target
            else:
                work = arrays.result(call.shape, call.dtype, like=xa)
            src = arrays.flat(xa)
            data = self._data_stage(call, seq, src if work is not xa else None,
                                    work.reshape(-1))

            def finish():
                result = work
                if call.op is ReduceOp.MEAN:
                    dest = target if target is not None else (
                        work if same else arrays.result(call.shape, call.final, like=xa))
                    result = arrays.divide(work, self.size, out=dest)
                elif target is not None and work is not target:
                    arrays.copy(target, work)
                    result = target
                if late is not None:
                    raise late
                return result

            finish.late = late  # type: ignore[attr-defined]
            return call, [data], finish

        result = self._start("all_reduce", build, async_op, timeout)
        if fast_key is not None and fast_key not in self._fast and seen:
            if len(self._fast) > 1024:  # programs use few distinct calls; bound it anyway
                self._fast.clear()
            fast = self._fast[fast_key] = FastAllReduce.build(self, seen[0], x, op, algorithm)
            if fast is not None:
                self._hot = fast
        return result

    def _fits(self, out: Any, x: Any) -> bool:
        """Whether ``out`` can take ``x``'s all-reduce as it is (the fast path's check)."""
        arrays = self.arrays
        return (arrays.owns(out) and out.shape == x.shape and out.dtype == x.dtype
                and arrays.contiguous(out) and arrays.writable(out))

    @accepts_foreign
    def reduce(self, x: Any, op: ReduceOp | str = "sum", root: int = 0, algorithm: Any = "auto",
               *, out: Any = None, shards: int = 0, timeout: float | None = None,
               async_op: bool = False) -> Any:
        """Reduce onto ``root``; returns the result there and None on every other rank."""
        def build(seq):
            arrays = self.arrays
            xa = self.adapt(x, "x")
            call = self._call(Collective.REDUCE, xa, op, algorithm, root=root, shards=shards)
            mine = self.rank == call.root
            target, late = self._target(out if mine else None, call.shape, call.final)
            work = (arrays.result(call.shape, call.dtype, like=xa) if mine
                    else arrays.empty(call.shape, call.dtype, like=xa))
            data = self._data_stage(call, seq, arrays.flat(xa), work.reshape(-1))

            def finish():
                if not mine:
                    return None
                result = work
                if call.op is ReduceOp.MEAN:
                    dest = target if target is not None else (
                        work if call.final == call.dtype
                        else arrays.result(call.shape, call.final, like=xa))
                    result = arrays.divide(work, self.size, out=dest)
                elif target is not None:
                    arrays.copy(target, work)
                    result = target
                if late is not None:
                    raise late
                return result

            finish.late = late  # type: ignore[attr-defined]
            return call, [data], finish

        return self._start("reduce", build, async_op, timeout)

    @accepts_foreign
    def broadcast(self, x: Any = None, root: int = 0, algorithm: Any = "auto", *, out: Any = None,
                  timeout: float | None = None, async_op: bool = False) -> Any:
        """Every rank gets root's ``x``; other ranks may pass None (or ``out`` to fill).

        Non-roots that pass neither ``x`` nor ``out`` learn the shape and dtype from the root
        (an extra small exchange per call; pass ``out`` to save it).
        """
        from .spmd_broadcast import build_broadcast

        return self._start("broadcast", build_broadcast(self, x, root, algorithm, out),
                           async_op, timeout)

    @accepts_foreign
    def all_gather(self, x: Any, axis: int = 0, algorithm: Any = "auto", *, out: Any = None,
                   timeout: float | None = None, async_op: bool = False) -> Any:
        """Concatenation of every rank's ``x`` along ``axis``, in rank order."""
        def build(seq):
            arrays = self.arrays
            xa = self.adapt(x, "x")
            ndim = max(len(xa.shape), 1)
            if not -ndim <= axis < ndim:
                raise ValueError(f"axis={axis} is out of range for x of {len(xa.shape)} "
                                 "dimensions")
            call = self._call(Collective.ALL_GATHER, xa, None, algorithm, axis=axis % ndim)
            n, count = self.size, call.count
            base = call.shape if call.shape else (1,)
            gathered = list(base)
            gathered[call.axis] *= n
            target, late = self._target(out, tuple(gathered), call.dtype)
            leading = all(d == 1 for d in base[:call.axis])
            if leading and target is not None and not overlaps(arrays, target, xa):
                work = target.reshape(-1)
            else:
                work = arrays.result((n * count,), call.dtype, like=xa)
            arrays.copy(work[self.rank * count:(self.rank + 1) * count], arrays.flat(xa))
            data = self._data_stage(call, seq, None, work, granule=count if count else 1)

            def finish():
                if leading:
                    result = work.reshape(tuple(gathered))
                else:
                    result = arrays.concatenate(list(work.reshape((n, *base))), call.axis)
                if target is not None and result.base is not target and result is not target:
                    arrays.copy(target, result)
                    result = target
                if late is not None:
                    raise late
                return result

            finish.late = late  # type: ignore[attr-defined]
            return call, [data], finish

        return self._start("all_gather", build, async_op, timeout)

    @accepts_foreign
    def reduce_scatter(self, x: Any, op: ReduceOp | str = "sum", algorithm: Any = "auto", *,
                       out: Any = None, shards: int = 0, timeout: float | None = None,
                       async_op: bool = False) -> Any:
        """Reduce, then rank ``i`` keeps rows ``floor(i R / n)`` to ``floor((i+1) R / n)``."""
        def build(seq):
            arrays = self.arrays
            xa = self.adapt(x, "x")
            if len(xa.shape) == 0:
                raise ValueError("x is a scalar; reduce_scatter splits axis 0, so pass an array")
            call = self._call(Collective.REDUCE_SCATTER, xa, op, algorithm, shards=shards)
            rows, n, i = call.shape[0], self.size, self.rank
            lo, hi = i * rows // n, (i + 1) * rows // n
            mine = (hi - lo, *call.shape[1:])
            target, late = self._target(out, mine, call.final)
            work = arrays.empty(call.shape, call.dtype, like=xa)
            row = int(np.prod(call.shape[1:], dtype=np.int64))
            data = self._data_stage(call, seq, arrays.flat(xa), work.reshape(-1),
                                    granule=row if row else 1)

            def finish():
                block = work[lo:hi]
                if call.op is ReduceOp.MEAN:
                    dest = target if target is not None else arrays.result(mine, call.final,
                                                                           like=xa)
                    result = arrays.divide(block, n, out=dest)
                else:
                    result = target if target is not None else arrays.result(mine, call.dtype,
                                                                             like=xa)
                    arrays.copy(result, block)
                if late is not None:
                    raise late
                return result

            finish.late = late  # type: ignore[attr-defined]
            return call, [data], finish

        return self._start("reduce_scatter", build, async_op, timeout)
