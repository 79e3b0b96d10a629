"""Collectives that copy blocks without reducing them: gather, scatter and all-to-all (mixed
into `Communicator`; ``multi_device_copies`` is the same for one process's devices; Python
objects: ``spmd_objects``).

``gather`` stacks every rank's ``x`` along a new leading axis on the root (``all_gather``
concatenates instead); ``scatter`` hands rank ``r`` row ``r`` of the root's ``x``; ``all_to_all``
sends block ``j`` of each rank's leading axis to rank ``j``. Their plans are proved by the same
checker as the reductions' (every block lands exactly once, where it belongs).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np

from .. import algorithms
from ..algorithms.schedule import Collective
from ..foreign_calls import accepts_foreign
from ..hints import ArrayT, SpmdAlgorithm
from ..runtime.calls import BatchTag
from ..runtime.execute.exchange import ExchangeRun
from ..runtime.from_root import Like
from ..runtime.native_stage import ScheduleInTurn
from ..runtime.refusals import refusing
from ..runtime.results import Ready, Stacked
from ..runtime.work import Work
from .comm_parts import CommParts

SCALAR_ALL_TO_ALL = "x is a scalar; all_to_all splits its leading axis, so pass an array"


class CopyOps(CommParts):
    """gather, scatter, all_to_all."""

    @overload
    def gather(self, x: ArrayT, root: int = ..., algorithm: SpmdAlgorithm = ..., *,
               timeout: float | None = ..., async_op: Literal[False] = ...) -> ArrayT | None: ...
    @overload
    def gather(self, x: ArrayT, root: int = ..., algorithm: SpmdAlgorithm = ..., *,
               timeout: float | None = ..., async_op: Literal[True]) -> Work[ArrayT | None]: ...
    @refusing("gather")
    @accepts_foreign
    def gather(self, x: ArrayT, root: int = 0, algorithm: SpmdAlgorithm = "auto", *,
               timeout: float | None = None, async_op: bool = False) -> Any:
        """The root gets every rank's ``x`` stacked along a new leading axis.

        Parameters
        ----------
        x
            This rank's array (every rank: the same shape and dtype).
        root
            The rank that gets the stack.
        algorithm
            ``"auto"``, ``"tree"`` or ``"shuffle"``.
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).
        async_op
            Return a `Work` handle whose ``wait()`` returns the result instead.

        Returns
        -------
        ArrayT or None
            On the root, the stack of shape ``(size, *x.shape)`` (row ``r`` from rank ``r``);
            None elsewhere.

        Raises
        ------
        TypeError
            A bad argument, before any data moves; ValueError likewise.
        CollectiveMismatchError
            The ranks called different collectives, or with different arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        def build(seq):
            arrays = self.arrays
            xa = self.adapt(x, "x")
            call = self.calls.validated(Collective.GATHER, xa, None, algorithm, root=root)
            n, count = self.size, call.count
            mine = self.rank == call.root
            work = (arrays.result((n * count,), call.dtype, like=xa) if mine
                    else arrays.empty((n * count,), call.dtype, like=xa))
            arrays.copy(work[self.rank * count:(self.rank + 1) * count], arrays.flat(xa))
            data = self.calls.data_stage(call, seq, None, work, granule=count if count else 1)
            return call, [data], Stacked(work, (n, *call.shape)) if mine else Ready()

        return self.calls.start("gather", build, async_op, timeout)

    @overload
    def scatter(self, x: ArrayT | None = ..., root: int = ..., algorithm: SpmdAlgorithm = ...,
                *, out: ArrayT | None = ..., timeout: float | None = ...,
                async_op: Literal[False] = ...) -> ArrayT: ...
    @overload
    def scatter(self, x: ArrayT | None = ..., root: int = ..., algorithm: SpmdAlgorithm = ...,
                *, out: ArrayT | None = ..., timeout: float | None = ...,
                async_op: Literal[True]) -> Work[ArrayT]: ...
    @refusing("scatter")
    @accepts_foreign
    def scatter(self, x: ArrayT | None = None, root: int = 0, algorithm: SpmdAlgorithm = "auto",
                *, out: ArrayT | None = None, timeout: float | None = None,
                async_op: bool = False) -> Any:
        """Rank ``r`` gets row ``r`` of the root's ``x``.

        Parameters
        ----------
        x
            On the root, an array whose leading axis has ``size`` rows; elsewhere None, or an
            array of the root's shape and dtype (agreed with the root's: a mismatch raises).
        root
            The rank whose rows are handed out.
        algorithm
            ``"auto"``, ``"tree"`` or ``"shuffle"``.
        out
            Where this rank's row goes; else a new array. (With ``check=False`` it also tells
            a non-root the row's shape and dtype, which it otherwise learns from the root.)
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).
        async_op
            Return a `Work` handle whose ``wait()`` returns the result instead.

        Returns
        -------
        ArrayT
            Row ``rank`` of the root's ``x``.

        Raises
        ------
        TypeError
            A bad argument, before any data moves; ValueError likewise.
        CollectiveMismatchError
            The ranks called different collectives, or with different arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        from .spmd_from_root import build_rooted

        return self.calls.start("scatter", build_rooted(self, Collective.SCATTER, x, root, algorithm,
                                                   out), async_op, timeout)

    @overload
    def all_to_all(self, x: ArrayT, splits: Sequence[int] | None = ...,
                   algorithm: SpmdAlgorithm = ..., *, timeout: float | None = ...,
                   async_op: Literal[False] = ...) -> ArrayT: ...
    @overload
    def all_to_all(self, x: ArrayT, splits: Sequence[int] | None = ...,
                   algorithm: SpmdAlgorithm = ..., *, timeout: float | None = ...,
                   async_op: Literal[True]) -> Work[ArrayT]: ...
    @refusing("all_to_all")
    @accepts_foreign
    def all_to_all(self, x: ArrayT, splits: Sequence[int] | None = None,
                   algorithm: SpmdAlgorithm = "auto", *, timeout: float | None = None,
                   async_op: bool = False) -> Any:
        """Block ``j`` of ``x``'s leading axis goes to rank ``j``; the result's block ``i``
        came from rank ``i``.

        Parameters
        ----------
        x
            This rank's array (every rank: the same dtype and trailing shape).
        splits
            This rank's block sizes (rows sent to each rank, summing to the leading axis);
            every rank passes its own, and receivers learn theirs with one small all-gather.
            None: the leading axis is cut into ``size`` equal blocks (it must divide).
        algorithm
            ``"auto"``, ``"ring"`` or ``"shuffle"``.
        timeout
            Seconds this call may wait for its peers (None: the communicator's timeout).
        async_op
            Return a `Work` handle whose ``wait()`` returns the result instead.

        Returns
        -------
        ArrayT
            The blocks every rank sent this one, in rank order.

        Raises
        ------
        TypeError
            A bad argument, before any data moves; ValueError likewise (``splits`` that do
            not sum to the leading axis, or a leading axis ``size`` does not divide).
        CollectiveMismatchError
            The ranks called different collectives, or with different arguments.
        CollectiveTimeoutError
            A peer did not arrive within ``timeout``.
        """
        arrays = self.arrays
        n = self.size
        counts = None
        if splits is not None:  # every rank's sizes first (bad ones become a row of -1s)
            try:
                shape = self.adapt(x, "x").shape
                if len(shape) == 0:
                    raise ValueError(SCALAR_ALL_TO_ALL)
                mine, problem = _check_splits(splits, shape[0], n), None
            except (TypeError, ValueError) as exc:
                mine, problem = np.full(n, -1, np.int64), exc
            with self.calls.part_of(SPLITS):  # (a peer's plain all_to_all is told what it met)
                counts = self.all_gather(mine, timeout=timeout).reshape(n, n)
            failed = [r for r in range(n) if (counts[r] < 0).any()]
            if problem is not None:
                raise problem
            if failed:
                from ..errors import PeerFailedError

                raise PeerFailedError(f"rank {self.rank}: all_to_all cannot run because rank(s) "
                                      f"{failed} passed bad splits")

        def build(seq):
            nonlocal counts
            xa = self.adapt(x, "x")
            if len(xa.shape) == 0:
                raise ValueError(SCALAR_ALL_TO_ALL)
            rows, row_shape = xa.shape[0], tuple(xa.shape[1:])
            row = int(np.prod(row_shape, dtype=np.int64))
            if counts is None:
                if rows % n:
                    raise ValueError(f"x has {rows} rows, which do not split into {n} equal "
                                     "blocks; pass splits= with the rows for each rank")
                counts = np.full((n, n), rows // n, np.int64)
                shape, rows_vary = tuple(xa.shape), False
            else:  # (splits: the leading axis may differ between ranks; every rank's says 0)
                shape, rows_vary = (0, *row_shape), True
            call = self.calls.validated(Collective.ALL_TO_ALL, Like(shape, xa.dtype), None,
                                        algorithm, rows_vary=rows_vary)
            send_at = [0, *np.cumsum(counts[self.rank] * row).tolist()]
            recv_at = [0, *np.cumsum(counts[:, self.rank] * row).tolist()]
            result = arrays.result((int(counts[:, self.rank].sum()), *row_shape), call.dtype,
                                   like=xa)
            src, dst = arrays.flat(xa), result.reshape(-1)
            r = self.rank
            arrays.copy(dst[recv_at[r]:recv_at[r + 1]], src[send_at[r]:send_at[r + 1]])
            name = call.run_as if call.run_as != "native" else "shuffle"
            plan = algorithms.rank_plan(Collective.ALL_TO_ALL, name, n, self.rank)
            data = ExchangeRun(plan, src, dst, send_at, recv_at, self.transport.data, seq=seq,
                               check=call.check if self.check else 0)
            if self.calls.rounds_in_turn:
                data = ScheduleInTurn(self.calls.engine, data)
            return call, [data], Ready(result)

        return self.calls.start("all_to_all", build, async_op, timeout)


# the all-gather of every rank's split sizes, as part of an all-to-all
SPLITS = BatchTag("the sizes of all_to_all(splits=...)")


def _check_splits(splits: Sequence[int], rows: int, n: int) -> np.ndarray:
    try:  # (each an integer: 6.5 or "6" cast quietly to 6; a scalar is no list)
        if any(isinstance(s, bool) for s in splits):
            raise TypeError
        counts = [operator.index(s) for s in splits]
        mine = np.asarray(counts, np.int64)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"splits={splits!r} must be a list of {n} whole numbers of rows (one "
                        "per rank)") from None
    # (summed as Python integers: an int64 sum may wrap round to the right total)
    if mine.shape != (n,) or (mine < 0).any() or sum(counts) != rows:
        raise ValueError(f"splits={counts!r} must be {n} non-negative row counts (one per "
                         f"rank) summing to x's leading axis, {rows}")
    return mine
