"""The reductions of `Communicator` that leave every rank's result whole: all-reduce (with
its hot path) and reduce, argument by argument.

Each method describes its call, chooses its buffers (the user's ``out`` where it can take the
result, else a fresh result the user may keep) and hands ``comm.calls.start`` a builder of
the call's data stage and of the record that returns the result (``runtime.results``). Every method takes
``async_op=True`` to return a `Work` handle instead of the result.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np

from ..algorithms.schedule import Collective
from ..arrays import plain_ndarray
from ..compression import requested
from ..foreign import is_foreign
from ..foreign_calls import accepts_foreign
from ..hints import ArrayT, Compression, Op, SpmdAlgorithm
from ..overlap import overlaps, same_memory
from ..runtime.hot_path import FastAllReduce
from ..runtime.refusals import refusing
from ..runtime.results import Ready, Reduced
from ..runtime.validate import Groups, hot_key, no_shards, valid_timeout
from ..runtime.work import Work
from ..widened import widened
from .comm_parts import CommParts
from .compressed import spmd_all_reduce
from .spmd_foreign import foreign_all_reduce, viewed_all_reduce


def through_shared(transport: Any, x: Any, out: Any, algorithm: Any) -> Any:
    """``algorithm``; or, for ``"auto"`` where ``x`` and ``out`` lie in memory the transport's
    ranks share (``Communicator.shared_empty``), the transport's way through it
    (``SharedMemory.algorithm_for``: a name of its own, in the call's signature)."""
    shared = transport.shared_memory
    if shared is not None and out is not None and algorithm == "auto":
        return shared.algorithm_for(x, out) or algorithm
    return algorithm


class ReductionOps(CommParts):
    """All-reduce and reduce (mixed into Communicator)."""

    @overload
    def all_reduce(self, x: ArrayT, op: Op = ..., algorithm: SpmdAlgorithm = ..., *,
                   out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
                   timeout: float | None = ..., compression: Compression = ...,
                   async_op: Literal[False] = ...) -> ArrayT: ...
    @overload
    def all_reduce(self, x: ArrayT, op: Op = ..., algorithm: SpmdAlgorithm = ..., *,
                   out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
                   timeout: float | None = ..., compression: Compression = ...,
                   async_op: Literal[True]) -> Work[ArrayT]: ...
    def all_reduce(self, x: ArrayT, op: Op = "sum", algorithm: SpmdAlgorithm = "auto", *,
                   out: ArrayT | None = None, shards: int = 0, groups: Groups = None,
                   timeout: float | None = None, compression: Compression = None,
                   async_op: bool = False) -> Any:
        """Reduce ``x`` over all ranks; every rank gets the (bitwise identical) result.

        Parameters
        ----------
        x
            This rank's array (every rank passes one of the same shape and dtype).
        op
            ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
        algorithm
            ``"auto"``, a name (``"ring"``, ``"rechd"``, ``"tree"``, ...), ``"native"`` (the
            transport's own collective), a two-level ``"A/B"``, or a spec (``("xring", 2)``).
        out
            Where the result goes (``x`` itself: in place); else a new array.
        shards
            Ring sub-chunks or shuffle gather ranks (0: the algorithm's default).
        groups
            The groups of a two-level ``"A/B"``: a group size or a partition of the ranks.
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).
        compression
            ``"fp16"`` or ``"bf16"``: carry a float32/float64 SUM or MEAN in that narrower
            float and cast the result back (see `collectives.compression`); None: as it is.
        async_op
            Return a `Work` handle whose ``wait()`` returns the result instead.

        Returns
        -------
        ArrayT
            The reduction, of ``x``'s array type (integer MEAN: float64).

        Raises
        ------
        TypeError
            A bad argument, on this rank before any data moves (its peers raise
            `PeerFailedError` naming it); ValueError likewise.
        CollectiveMismatchError
            The ranks called different collectives, or with different arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``; the communicator is broken after it.
        """
        fast = self.calls.last_hot  # the hot path the last repeated call took
        if (fast is not None and x.__class__ is fast.cls and timeout is None
                and async_op.__class__ is bool
                and shards.__class__ is int and not shards and groups is None  # (no_shards)
                and compression is None):
            try:
                if not (op is fast.op and algorithm is fast.algorithm and x.dtype is fast.dtype
                        and x.shape == fast.shape):  # (the same arguments: by identity)
                    # another signature's hot path, if it has one
                    fast = self.calls.hot_paths.get(hot_key(x, op, algorithm))
                if fast is not None and not (out is None or (
                        out.__class__ is fast.cls and out.shape == fast.shape
                        and (out.dtype is fast.dtype or out.dtype == fast.dtype))):
                    fast = None  # (its out= another kind of array)
            except Exception:  # noqa: BLE001 - no hot path: an unhashable spec (a list of
                fast = None  # ranges), or a tensor without a shape (nested): the call says
            if fast is not None:
                self.calls.last_hot = fast
                result = fast(x, out) if async_op is False else fast.issue(x, out)
                if result is not None:
                    return result
        return self._all_reduce(x, op, algorithm, out, shards, groups, timeout, async_op,
                                compression)

    @refusing("all_reduce")
    def _all_reduce(self, x: Any, op: Any, algorithm: Any, out: Any, shards: int, groups: Any,
                    timeout: float | None, async_op: bool, compression: str | None) -> Any:
        """``all_reduce`` beyond the hot path (kept apart: its closures would make every
        argument of ``all_reduce`` a cell, which costs the hot path a few hundred ns): another
        library's arrays cross here (``spmd_foreign``), the rest runs as ``_own_all_reduce``."""
        if x.__class__ is not np.ndarray:
            if isinstance(x, np.ndarray):
                x = plain_ndarray(x, "x")  # (np.matrix, memmap: plain; masked: raises)
            else:
                if self.transport.native is None and async_op is False:  # (no hot path to learn)
                    result = viewed_all_reduce(self, self._own_all_reduce, x, op, algorithm,
                                               out, shards, groups, timeout, compression)
                    if result is not None:
                        return result
                if is_foreign(x):
                    return foreign_all_reduce(self, self._own_all_reduce, x, op, algorithm,
                                              out, shards, groups, timeout, async_op,
                                              compression)
        if out is not None and out.__class__ is not np.ndarray and is_foreign(out):
            return foreign_all_reduce(self, self._own_all_reduce, x, op, algorithm, out,
                                      shards, groups, timeout, async_op, compression)
        return self._own_all_reduce(x, op, algorithm, out, shards, groups, timeout, async_op,
                                    compression)

    def _own_all_reduce(self, x: Any, op: Any, algorithm: Any, out: Any, shards: int,
                        groups: Any, timeout: float | None, async_op: bool,
                        compression: str | None) -> Any:
        """``all_reduce`` of the transport's own arrays (NumPy's, or a backend's such as
        CuPy's), called inside ``_all_reduce``'s refusal (no second one)."""
        if requested(compression):
            return spmd_all_reduce(self, x, op, algorithm, compression, out=out, shards=shards,
                                   groups=groups, timeout=timeout, async_op=async_op)
        asked = algorithm
        algorithm = through_shared(self.transport, x, out, algorithm)
        shared = algorithm is not asked  # (peers read this rank's x where it lies)
        fast_key = None
        # (with COLLECTIVES_DEBUG=detail every call is agreed and logged: no hot path; a bad
        # timeout= takes the checked path, which raises naming it). An asynchronous call
        # without timeout= (its timeout is its wait's) runs it where the transport tests its
        # request briefly (``FastAllReduce.issue``: MPI's), and binds it for later calls (a
        # transport whose blocking calls only enqueue runs it for asynchronous ones through
        # the blocking call, see ``hot_ready``).
        if (no_shards(shards) and groups is None and self.arrays.owns(x)
                and valid_timeout(timeout)):
            batch = self.calls.batch  # (a batch's bucket: a hot path of its own, never last)
            try:
                fast_key = hot_key(x, op, algorithm) + ((batch,) if batch else ())
                fast = self.calls.hot_paths.get(fast_key)
            except Exception:  # noqa: BLE001 - an unhashable spec (a list of ranges): no
                # hot path (anything else raises again where the call reaches its peers)
                fast_key = fast = None
            if fast is not None and (async_op is False or (async_op is True and timeout is None)
                                     ) and (out is None or self._fits(out, x)):
                self.calls.last_hot = fast if not batch else None
                result = (fast(x, out, timeout) if async_op is False else
                          fast.issue(x, out))  # (an asynchronous call's timeout is its wait's)
                if result is not None:
                    return result
        seen: list = []

        def build(seq):
            arrays = self.arrays
            passed = self.adapt(x, "x")
            xa = widened(arrays, passed, op)
            call = self.calls.validated(Collective.ALL_REDUCE, xa, op, algorithm, shards=shards,
                                        groups=groups, passed=passed)
            seen.append(call)
            target, late = self.calls.target(out, call.shape, call.final)
            same = call.final == call.dtype
            src = arrays.flat(xa)
            if target is None or not same:
                work = arrays.result(call.shape, call.dtype, like=xa)
            elif target is xa:
                work = src = target  # (in place)
            elif not overlaps(arrays, target, xa):
                work = target
            elif same_memory(arrays, target, xa):
                work = src = target  # (in place: another view of x's memory)
            elif shared:  # (x and out must stay where they lie: x's values go into out first,
                staged = arrays.empty(call.shape, call.dtype, like=xa)  # and run in place)
                arrays.copy(staged, xa)
                arrays.copy(target, staged)
                work = src = target
            else:
                work = arrays.result(call.shape, call.dtype, like=xa)
            data = self.calls.data_stage(call, seq, src if work is not src else None,
                                         work.reshape(-1))
            return call, [data], Reduced(arrays, call, work, self.size, target, late, xa)

        result = self.calls.start("all_reduce", build, async_op, timeout)
        if fast_key is not None and fast_key not in self.calls.hot_paths and seen:
            if len(self.calls.hot_paths) > 1024:  # programs use few distinct calls; bound it anyway
                self.calls.hot_paths.clear()
            fast = self.calls.hot_paths[fast_key] = FastAllReduce.build(self, seen[0], x, op, algorithm)
            if fast is not None and not self.calls.batch:  # (a bucket's is never last)
                self.calls.last_hot = fast
        return result

    def hot_ready(self, x: Any, op: Op = "sum", algorithm: SpmdAlgorithm = "auto") -> bool:
        """Whether a blocking ``all_reduce(x, op, algorithm)`` would take the hot path now: its
        signature agreed and bound, and nothing in flight before it (a hook for transports
        whose blocking calls only enqueue, such as NCCL's: their asynchronous calls can run
        it and wait on the device).

        Parameters
        ----------
        x, op, algorithm
            The call's arguments, as ``all_reduce`` takes them.

        Returns
        -------
        bool
            True where the call would run at once, without an operation in flight.
        """
        try:
            fast = self.calls.hot_paths.get(hot_key(x, op, algorithm))
        except (TypeError, AttributeError):  # unhashable spec, or not an array
            return False
        engine = self.calls.engine
        return fast is not None and not engine.inflight and engine.broken is None

    def _fits(self, out: Any, x: Any) -> bool:
        """Whether ``out`` can take ``x``'s all-reduce as it is (the fast path's check)."""
        arrays = self.arrays
        return (arrays.owns(out) and out.shape == x.shape and out.dtype == x.dtype
                and arrays.contiguous(out) and arrays.writable(out))

    @overload
    def reduce(self, x: ArrayT, op: Op = ..., root: int = ..., algorithm: SpmdAlgorithm = ...,
               *, out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
               timeout: float | None = ..., async_op: Literal[False] = ...) -> ArrayT | None: ...
    @overload
    def reduce(self, x: ArrayT, op: Op = ..., root: int = ..., algorithm: SpmdAlgorithm = ...,
               *, out: ArrayT | None = ..., shards: int = ..., groups: Groups = ...,
               timeout: float | None = ..., async_op: Literal[True]) -> Work[ArrayT | None]: ...
    @refusing("reduce")
    @accepts_foreign
    def reduce(self, x: ArrayT, op: Op = "sum", root: int = 0, algorithm: SpmdAlgorithm = "auto",
               *, out: ArrayT | None = None, shards: int = 0, groups: Groups = None,
               timeout: float | None = None, async_op: bool = False) -> Any:
        """Reduce ``x`` over all ranks onto ``root``.

        Parameters
        ----------
        x
            This rank's array (every rank passes one of the same shape and dtype).
        op
            ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
        root
            The rank that gets the result.
        algorithm
            As for `all_reduce`.
        out
            On the root: where the result goes; else a new array.
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
        ArrayT or None
            The reduction on ``root``; None on every other rank.

        Raises
        ------
        TypeError
            A bad argument, on this rank before any data moves; ValueError likewise.
        CollectiveMismatchError
            The ranks called different collectives, or with different arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        def build(seq):
            arrays = self.arrays
            passed = self.adapt(x, "x")
            xa = widened(arrays, passed, op)
            call = self.calls.validated(Collective.REDUCE, xa, op, algorithm, root=root,
                                        shards=shards, groups=groups, passed=passed)
            mine = self.rank == call.root
            target, late = self.calls.target(out if mine else None, call.shape, call.final)
            work = (arrays.result(call.shape, call.dtype, like=xa) if mine
                    else arrays.empty(call.shape, call.dtype, like=xa))
            data = self.calls.data_stage(call, seq, arrays.flat(xa), work.reshape(-1))
            finish = Reduced(arrays, call, work, self.size, target, late, xa) if mine else Ready()
            return call, [data], finish

        return self.calls.start("reduce", build, async_op, timeout)
