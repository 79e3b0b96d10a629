"""The ``*_init`` methods of ``Communicator``: prepared collectives.

Each validates its call and buffers once and returns a ``PreparedCall``. Making one is a step
every rank takes at the same point among its calls, as MPI's ``MPI_Allreduce_init``: it moves
no data, but a bad argument on one rank raises on every rank there (``refusals.setting_up``).
``x`` must be C-contiguous (it is read in place at
every ``start()``); ``out`` is required, and is either ``x`` itself (in place) or shares no
memory with it. A host array of another library that takes ``out=`` (a PyTorch CPU tensor) is
bound through its NumPy view, and ``wait()`` hands back the caller's own array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..array_kinds import viewed_in_place
from ..hints import Array, Op, SpmdAlgorithm
from ..overlap import overlaps
from ..runtime.prepared import PreparedCall
from ..runtime.refusals import setting_up
from ..runtime.results import Block, Ready, Reduced
from ..runtime.validate import check_out
from ..widened import widened
from .comm_parts import CommParts
from .spmd_reductions import through_shared
from .spmd_spread import SCALAR_REDUCE_SCATTER


class PreparedOps(CommParts):
    """all_reduce_init, reduce_init, broadcast_init, all_gather_init, reduce_scatter_init."""

    def _bound(self, x: Any, out: Any) -> tuple[Any, Any, Any]:
        """``(x, out, returns)``: ``out`` as the array the call writes (``viewed_in_place``), ``x`` as
        the array it reads (that same array where the caller passed ``out=x``), and what
        ``wait()`` hands back: the caller's ``out`` where a view of it is bound, else None
        (the bound array itself)."""
        viewed = viewed_in_place(out, "out")
        xa = viewed if out is x and out is not None else self.adapt(viewed_in_place(x, "x"), "x")
        return xa, viewed, (out if viewed is not out else None)

    def _bind(self, x: Any, out: Any, shape: tuple, dtype: np.dtype, what: str,
              out_argument: str = "out"):
        """``x`` as an array, and ``out`` (named ``out_argument`` in errors) checked."""
        arrays = self.arrays
        xa = self._read_in_place(x, what)
        if out is None:
            raise TypeError(f"{what}: out is required (a prepared call writes its result there "
                            "every time)")
        check_out(out, shape, dtype, out_argument, arrays)
        if out is not xa and overlaps(arrays, out, xa):
            in_place = ("x itself (in place) or " if tuple(xa.shape) == tuple(shape) else "")
            raise ValueError(f"{what}: out overlaps x; pass {in_place}a separate array (a "
                             "prepared call reads x in place at every start)")
        return xa

    def _widened(self, xa: Any, op: Any) -> tuple[Any, Any]:
        """An integer MEAN's float64 copy of ``xa`` (``widened``), and what refills it from
        ``xa`` at every start (None: ``xa`` itself, read in place)."""
        wide = widened(self.arrays, xa, op) if self.arrays.owns(xa) else xa
        if wide is xa:
            return xa, None
        return wide, lambda: self.arrays.copy(wide, xa)

    def _read_in_place(self, x: Any, what: str) -> Any:
        """``x`` as an array a prepared call reads in place at every start: C-contiguous
        (a copy would be read once, at the call's making, and every run would send that)."""
        xa = self.adapt(x, "x")
        if not self.arrays.contiguous(xa):
            raise ValueError(f"{what}: x must be C-contiguous (a prepared call reads it in "
                             "place at every start)")
        return xa

    @setting_up("all_reduce_init")
    def all_reduce_init(self, x: Array, op: Op = "sum", algorithm: SpmdAlgorithm = "auto", *,
                        out: Array, shards: int = 0, groups: Any = None,
                        timeout: float | None = None) -> PreparedCall:
        """A prepared all-reduce of ``x`` into ``out``, agreed once and started many times.

        Parameters
        ----------
        x
            The array read at every ``start()``.
        op
            ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
        algorithm
            As for `all_reduce`.
        out
            The array every run writes (may be ``x``).
        shards
            Ring sub-chunks or shuffle gather ranks (0: the algorithm's default).
        groups
            The groups of a two-level ``"A/B"``.
        timeout
            Seconds making it waits for the peers to make it too (None: the
            communicator's).

        Returns
        -------
        PreparedCall
            ``start()`` runs it, ``wait()`` returns ``out``.

        Raises
        ------
        TypeError
            A bad argument; ValueError likewise (an ``out`` that overlaps ``x`` without
            being it).
        PeerFailedError
            A peer's argument was bad (every rank makes the prepared call at this point).
        """
        xa, out, returns = self._bound(x, out)
        wide, place = self._widened(xa, op)
        algorithm = through_shared(self.transport, wide, out, algorithm)
        call = self.calls.validated(Collective.ALL_REDUCE, wide, op, algorithm, shards=shards,
                                    groups=groups, passed=xa)
        xa = self._bind(xa, out, call.shape, call.final, "all_reduce_init")
        arrays = self.arrays
        work: Any = out if call.final == call.dtype else arrays.empty(call.shape, call.dtype, like=xa)
        src = None if xa is work else arrays.flat(xa if place is None else wide)
        return PreparedCall(self, "all_reduce", call, src, work.reshape(-1),
                            Reduced(arrays, call, work, self.size, out), returns=returns,
                            place=place)

    @setting_up("reduce_init")
    def reduce_init(self, x: Array, op: Op = "sum", root: int = 0,
                    algorithm: SpmdAlgorithm = "auto", *, out: Array | None = None,
                    shards: int = 0, groups: Any = None,
                    timeout: float | None = None) -> PreparedCall:
        """A prepared reduce onto ``root``.

        Parameters
        ----------
        x
            The array read at every ``start()``.
        op
            ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
        root
            The rank that gets the result.
        algorithm
            As for `all_reduce`.
        out
            On the root, the array every run writes (required there); ignored elsewhere.
        shards
            Ring sub-chunks or shuffle gather ranks (0: the algorithm's default).
        groups
            The groups of a two-level ``"A/B"``.
        timeout
            Seconds making it waits for the peers to make it too (None: the
            communicator's).

        Returns
        -------
        PreparedCall
            ``start()`` runs it, ``wait()`` returns ``out`` on the root and None elsewhere.

        Raises
        ------
        TypeError
            A bad argument; ValueError likewise.
        """
        xa, out, returns = self._bound(x, out)
        wide, place = self._widened(xa, op)
        call = self.calls.validated(Collective.REDUCE, wide, op, algorithm, root=root,
                                    shards=shards, groups=groups, passed=xa)
        arrays = self.arrays
        mine = self.rank == call.root
        if mine:
            xa = self._bind(xa, out, call.shape, call.final, "reduce_init")
        else:  # (its x goes out at every start as much as the root's)
            xa = self._read_in_place(xa, "reduce_init")
        work = arrays.empty(call.shape, call.dtype, like=xa)
        finish = Reduced(arrays, call, work, self.size, out) if mine else Ready()
        return PreparedCall(self, "reduce", call, arrays.flat(xa if place is None else wide),
                            work.reshape(-1), finish, returns=returns if mine else None,
                            place=place)

    @setting_up("broadcast_init")
    def broadcast_init(self, x: Array, root: int = 0, algorithm: SpmdAlgorithm = "auto", *,
                       timeout: float | None = None) -> PreparedCall:
        """A prepared broadcast of root's ``x`` into every rank's ``x``.

        Parameters
        ----------
        x
            On the root, the array sent at every ``start()``; elsewhere, the array every run
            writes (the same shape and dtype on every rank).
        root
            The rank whose ``x`` everyone gets.
        algorithm
            As for `broadcast`.
        timeout
            Seconds making it waits for the peers to make it too (None: the
            communicator's).

        Returns
        -------
        PreparedCall
            ``start()`` runs it, ``wait()`` returns ``x``.

        Raises
        ------
        TypeError
            A bad argument; ValueError likewise.
        """
        viewed = viewed_in_place(x, "x")
        xa = self.adapt(viewed, "x")
        call = self.calls.validated(Collective.BROADCAST, xa, None, algorithm, root=root)
        xa = self._bind(xa, xa, call.shape, call.dtype, "broadcast_init", out_argument="x")
        return PreparedCall(self, "broadcast", call, None, xa.reshape(-1), lambda: xa,
                            returns=x if viewed is not x else None)

    @setting_up("all_gather_init")
    def all_gather_init(self, x: Array, algorithm: SpmdAlgorithm = "auto", *,
                        out: Array, timeout: float | None = None) -> PreparedCall:
        """A prepared all-gather along the leading axis into ``out``.

        Parameters
        ----------
        x
            The array read at every ``start()``.
        algorithm
            As for `all_gather`.
        out
            The array every run writes: ``size`` times ``x``'s leading axis.
        timeout
            Seconds making it waits for the peers to make it too (None: the
            communicator's).

        Returns
        -------
        PreparedCall
            ``start()`` runs it, ``wait()`` returns ``out``.

        Raises
        ------
        TypeError
            A bad argument; ValueError likewise.
        """
        xa, out, returns = self._bound(x, out)
        call = self.calls.validated(Collective.ALL_GATHER, xa, None, algorithm, axis=0)
        base = call.shape if call.shape else (1,)
        gathered = (base[0] * self.size, *base[1:])
        xa = self._bind(xa, out, gathered, call.dtype, "all_gather_init")
        arrays, count = self.arrays, call.count
        filled: Any = out  # (checked by _bind: an array of the transport's backend)
        flat_out = filled.reshape(-1)
        mine = flat_out[self.rank * count:(self.rank + 1) * count]
        src = arrays.flat(xa)
        return PreparedCall(self, "all_gather", call, None, flat_out, lambda: out,
                            granule=count if count else 1, place=lambda: arrays.copy(mine, src),
                            returns=returns)

    @setting_up("reduce_scatter_init")
    def reduce_scatter_init(self, x: Array, op: Op = "sum", algorithm: SpmdAlgorithm = "auto",
                            *, out: Array, shards: int = 0, groups: Any = None,
                            timeout: float | None = None) -> PreparedCall:
        """A prepared reduce-scatter: ``out`` takes this rank's rows of the total.

        Parameters
        ----------
        x
            The array read at every ``start()``.
        op
            ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"prod"`` or a `ReduceOp`.
        algorithm
            As for `reduce_scatter`.
        out
            The array every run writes: this rank's rows.
        shards
            Ring sub-chunks or shuffle gather ranks (0: the algorithm's default).
        groups
            The groups of a two-level ``"A/B"``.
        timeout
            Seconds making it waits for the peers to make it too (None: the
            communicator's).

        Returns
        -------
        PreparedCall
            ``start()`` runs it, ``wait()`` returns ``out``.

        Raises
        ------
        TypeError
            A bad argument; ValueError likewise.
        """
        xa, out, returns = self._bound(x, out)
        if len(xa.shape) == 0:  # (as a single call's: its rows were read, an IndexError)
            raise ValueError(SCALAR_REDUCE_SCATTER)
        wide, place = self._widened(xa, op)
        call = self.calls.validated(Collective.REDUCE_SCATTER, wide, op, algorithm,
                                    shards=shards, groups=groups, passed=xa)
        rows, n, i = call.shape[0], self.size, self.rank
        lo, hi = i * rows // n, (i + 1) * rows // n
        xa = self._bind(xa, out, (hi - lo, *call.shape[1:]), call.final, "reduce_scatter_init")
        arrays = self.arrays
        work = arrays.empty(call.shape, call.dtype, like=xa)
        row = int(np.prod(call.shape[1:], dtype=np.int64))
        finish = Block(arrays, call, work, n, lo, hi, (hi - lo, *call.shape[1:]), out)
        return PreparedCall(self, "reduce_scatter", call,
                            arrays.flat(xa if place is None else wide), work.reshape(-1),
                            finish, granule=row if row else 1, returns=returns, place=place)

