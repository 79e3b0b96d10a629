"""Broadcast, all-gather and reduce-scatter of `Communicator`: the collectives that spread
data, as ``multi_device_spread`` does for one process's devices. Broadcast leaves every rank
the root's array (its opening, whose non-roots learn shape and dtype from the root, is
``spmd_from_root``), all-gather every block of the ranks' arrays, reduce-scatter one reduced
block (mixed into Communicator like ``spmd_reductions``)."""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np

from ..algorithms.schedule import Collective
from ..foreign_calls import accepts_foreign
from ..hints import ArrayT, Op, SpmdAlgorithm
from ..overlap import overlaps
from ..runtime.refusals import refusing
from ..runtime.results import Block, Gathered
from ..runtime.validate import Groups, gather_axis
from ..runtime.work import Work
from ..widened import widened
from .comm_parts import CommParts

SCALAR_REDUCE_SCATTER = "x is a scalar; reduce_scatter splits axis 0, so pass an array"

class SpreadOps(CommParts):
    """Broadcast, all-gather and reduce-scatter (mixed into Communicator)."""

    @overload
    def broadcast(self, x: ArrayT, root: int = ..., algorithm: SpmdAlgorithm = ..., *,
                  out: ArrayT | None = ..., timeout: float | None = ...,
                  async_op: Literal[False] = ...) -> ArrayT: ...
    @overload
    def broadcast(self, x: ArrayT, root: int = ..., algorithm: SpmdAlgorithm = ..., *,
                  out: ArrayT | None = ..., timeout: float | None = ...,
                  async_op: Literal[True]) -> Work[ArrayT]: ...
    @overload
    def broadcast(self, x: None = ..., root: int = ..., algorithm: SpmdAlgorithm = ..., *,
                  out: ArrayT, timeout: float | None = ...,
                  async_op: Literal[False] = ...) -> ArrayT: ...
    @overload
    def broadcast(self, x: None = ..., root: int = ..., algorithm: SpmdAlgorithm = ..., *,
                  out: None = ..., timeout: float | None = ...,
                  async_op: Literal[False] = ...) -> Any: ...
    @overload
    def broadcast(self, x: None = ..., root: int = ..., algorithm: SpmdAlgorithm = ..., *,
                  out: Any = ..., timeout: float | None = ...,
                  async_op: Literal[True]) -> Work[Any]: ...
    @refusing("broadcast")
    @accepts_foreign
    def broadcast(self, x: ArrayT | None = None, root: int = 0,
                  algorithm: SpmdAlgorithm = "auto", *, out: ArrayT | None = None,
                  timeout: float | None = None, async_op: bool = False) -> Any:
        """Every rank gets root's ``x``.

        Every rank learns the root's shape and dtype in the call's opening exchange: a
        non-root's ``x`` or ``out`` is agreed with them (one unlike the root's array raises
        on every rank, before any data moves). With
        ``check=False`` there is no opening exchange: non-roots must pass ``x`` or ``out``.

        Parameters
        ----------
        x
            The array, on the root; None (or an array of the same shape and dtype) elsewhere.
        root
            The rank whose ``x`` everyone gets.
        algorithm
            As for `all_reduce`.
        out
            Where the copy goes; else a new array.
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).
        async_op
            Return a `Work` handle whose ``wait()`` returns the result instead.

        Returns
        -------
        ArrayT
            The root's array: a new array on every rank, the root's too (``out`` where one is
            given, filled).

        Raises
        ------
        TypeError
            A bad argument, before any data moves; ValueError likewise.
        CollectiveMismatchError
            The ranks called different collectives, or with different arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        from .spmd_from_root import build_broadcast

        return self.calls.start("broadcast", build_broadcast(self, x, root, algorithm, out),
                                async_op, timeout)

    @overload
    def all_gather(self, x: ArrayT, axis: int = ..., algorithm: SpmdAlgorithm = ..., *,
                   out: ArrayT | None = ..., timeout: float | None = ...,
                   async_op: Literal[False] = ...) -> ArrayT: ...
    @overload
    def all_gather(self, x: ArrayT, axis: int = ..., algorithm: SpmdAlgorithm = ..., *,
                   out: ArrayT | None = ..., timeout: float | None = ...,
                   async_op: Literal[True]) -> Work[ArrayT]: ...
    @refusing("all_gather")
    @accepts_foreign
    def all_gather(self, x: ArrayT, axis: int = 0, algorithm: SpmdAlgorithm = "auto", *,
                   out: ArrayT | None = None, timeout: float | None = None,
                   async_op: bool = False) -> Any:
        """Concatenation of every rank's ``x`` along ``axis``, in rank order.

        Parameters
        ----------
        x
            This rank's array (every rank passes one of the same shape and dtype).
        axis
            The axis to concatenate along.
        algorithm
            As for `all_reduce`.
        out
            Where the concatenation goes; else a new array.
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).
        async_op
            Return a `Work` handle whose ``wait()`` returns the result instead.

        Returns
        -------
        ArrayT
            Every rank's ``x``, concatenated in rank order.

        Raises
        ------
        TypeError
            A bad argument, before any data moves; ValueError likewise (an ``axis`` out of
            range).
        CollectiveMismatchError
            The ranks called different collectives, or with different arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        def build(seq):
            arrays = self.arrays
            xa = self.adapt(x, "x")
            call = self.calls.validated(Collective.ALL_GATHER, xa, None, algorithm,
                                        axis=gather_axis(axis, tuple(xa.shape), "x"))
            n, count = self.size, call.count
            base = call.shape if call.shape else (1,)
            gathered = list(base)
            gathered[call.axis] *= n
            target, late = self.calls.target(out, tuple(gathered), call.dtype)
            leading = all(d == 1 for d in base[:call.axis])
            if leading and target is not None and not overlaps(arrays, target, xa):
                work = target.reshape(-1)
            else:
                work = arrays.result((n * count,), call.dtype, like=xa)
            arrays.copy(work[self.rank * count:(self.rank + 1) * count], arrays.flat(xa))
            data = self.calls.data_stage(call, seq, None, work, granule=count if count else 1)
            return call, [data], Gathered(arrays, work, n, tuple(base), call.axis,
                                          tuple(gathered), leading, target, late)

        return self.calls.start("all_gather", build, async_op, timeout)

    @overload
    def reduce_scatter(self, x: ArrayT, op: Op = ..., algorithm: SpmdAlgorithm = ..., *,
                       out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
                       timeout: float | None = ..., async_op: Literal[False] = ...) -> ArrayT: ...
    @overload
    def reduce_scatter(self, x: ArrayT, op: Op = ..., algorithm: SpmdAlgorithm = ..., *,
                       out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
                       timeout: float | None = ..., async_op: Literal[True]) -> Work[ArrayT]: ...
    @refusing("reduce_scatter")
    @accepts_foreign
    def reduce_scatter(self, x: ArrayT, op: Op = "sum", algorithm: SpmdAlgorithm = "auto", *,
                       out: ArrayT | None = None, shards: int = 0, groups: Groups = None,
                       timeout: float | None = None, async_op: bool = False) -> Any:
        """Reduce, then rank ``i`` keeps rows ``floor(i R / n)`` to ``floor((i+1) R / n)``.

        Parameters
        ----------
        x
            This rank's array, at least one-dimensional (every rank: the same shape and dtype).
        op
            ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
        algorithm
            As for `all_reduce`.
        out
            Where this rank's block goes; else a new array.
        shards
            Ring sub-chunks or shuffle gather ranks (0: the algorithm's default).
        groups
            The groups of a two-level ``"A/B"``: a group size, or a partition of the ranks
            (None: the transport's nodes, where it has them).
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).
        async_op
            Return a `Work` handle whose ``wait()`` returns the result instead.

        Returns
        -------
        ArrayT
            This rank's block of the reduction.

        Raises
        ------
        TypeError
            A bad argument, before any data moves; ValueError likewise (a scalar ``x``).
        CollectiveMismatchError
            The ranks called different collectives, or with different arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        def build(seq):
            arrays = self.arrays
            passed = self.adapt(x, "x")
            xa = widened(arrays, passed, op)
            if len(xa.shape) == 0:
                raise ValueError(SCALAR_REDUCE_SCATTER)
            call = self.calls.validated(Collective.REDUCE_SCATTER, xa, op, algorithm, shards=shards,
                                        groups=groups, passed=passed)
            rows, n, i = call.shape[0], self.size, self.rank
            lo, hi = i * rows // n, (i + 1) * rows // n
            mine = (hi - lo, *call.shape[1:])
            target, late = self.calls.target(out, mine, call.final)
            work = arrays.empty(call.shape, call.dtype, like=xa)
            row = int(np.prod(call.shape[1:], dtype=np.int64))
            data = self.calls.data_stage(call, seq, arrays.flat(xa), work.reshape(-1),
                                         granule=row if row else 1)
            return call, [data], Block(arrays, call, work, n, lo, hi, mine, target, late, xa)

        return self.calls.start("reduce_scatter", build, async_op, timeout)
