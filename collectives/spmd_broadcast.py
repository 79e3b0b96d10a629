"""Broadcast, whose non-roots may not know what they will receive.

Non-roots may pass ``x=None``: they learn the shape and dtype from the root. So every
broadcast (with ``check=True``) opens with one small all-reduce over the control channel that
does three things at once: the usual agreement on what every rank knows (root, algorithm), the
shape and dtype where a non-root passed an ``x`` (it must match the root's), and the root's
*descriptor* (its shape and dtype, or its error), which reaches every rank as the maximum of
the root's bytes and everyone else's zeros. Then the data moves.

A non-root whose ``out`` does not fit receives into a buffer of its own and raises afterwards,
so no rank is left with half a broadcast.
"""

from __future__ import annotations

import math
import pickle
import zlib
from typing import Any

import numpy as np

from . import algorithms
from .agreement import Agreement
from .calls import resolve_algorithm
from .schedule import Collective
from .validate import check_root


class Header:
    """What every rank knows of a broadcast before the root's descriptor arrives."""

    collective = Collective.BROADCAST
    agrees_itself = True  # its opening stage is its agreement

    def __init__(self, root: int, algorithm: str):
        self.root, self.algorithm, self.run_as = root, algorithm, ""
        self.signature = ("broadcast", None, None, None, root, algorithm, 0, None, None)
        self.check = zlib.crc32(repr(self.signature).encode()) & ((1 << 30) - 1)
        self.call = None

    def describe(self) -> str:
        return self.call.describe() if self.call else f"broadcast(root={self.root})"


class Opening:
    """The broadcast's opening all-reduce (agreement + descriptor), then its data stage."""

    def __init__(self, comm, seq: int, header: Header, known: tuple | None, error, make_data):
        self.comm, self.seq, self.header, self.make_data = comm, seq, header, make_data
        self.data = None
        root = comm.rank == header.root
        blob = b""
        if root and error is None:
            blob = pickle.dumps(known, protocol=pickle.HIGHEST_PROTOCOL)
        mine = known if known is not None and not root else None
        digest = zlib.crc32(repr(mine).encode()) if mine is not None else None
        shape = known[0] if known is not None else None
        dtype = known[1] if known is not None else None
        signature = (header.signature[0], shape, dtype, *header.signature[3:])
        self.agreement = Agreement(comm._engine, seq, signature, header.check, error,
                                   known=digest, payload=blob) if comm.check else None
        self.known = None if comm.check else known

    def advance(self) -> bool:
        if self.data is None:
            if self.agreement is not None:
                if not self.agreement.advance():
                    return False
                self.known = pickle.loads(self.agreement.payload)
            self.data = self.make_data(self.known)
        return self.data.advance()

    def pending_peers(self) -> list[int]:
        stage = self.data if self.data is not None else self.agreement
        return stage.pending_peers() if stage is not None else []

    def abort(self) -> None:
        for stage in (self.agreement, self.data):
            if stage is not None:
                stage.abort()


def build_broadcast(comm, x: Any, root: int, algorithm: Any, out: Any):
    """The builder ``Communicator._start`` runs for ``comm.broadcast(...)``."""

    def build(seq):
        arrays = comm.arrays
        known, error, src, name = None, None, None, "auto"
        mine = root == comm.rank
        try:  # every error goes into the opening agreement, so that every rank hears of it
            root_ = check_root(root, comm.size)
            name, _ = resolve_algorithm(algorithm, 0, 0, comm._native_names)
            if name not in comm._native_names and name != "auto" and not algorithms.supports(
                    Collective.BROADCAST, name):
                raise ValueError(f"algorithm={algorithm!r} has no broadcast; use 'auto' or one of "
                                 f"{', '.join(algorithms.names_for(Collective.BROADCAST))}")
            if mine:  # the root prepares everything it can before agreeing
                xa = comm.adapt(x, "x")
                call = comm._call(Collective.BROADCAST, xa, None, name, root=root_)
                known = call.shape, call.dtype.str
                if len(known[0]) > 16:
                    raise ValueError(f"x has {len(known[0])} dimensions; at most 16 broadcast")
                src = arrays.flat(xa)
            elif x is not None:
                xa = comm.adapt(x, "x")
                known = tuple(xa.shape), np.dtype(xa.dtype).str
            elif not comm.check:
                if out is None:
                    raise ValueError("with check=False, non-root ranks must pass x or out (the "
                                     "shape and dtype to receive); or use check=True")
                known = tuple(out.shape), np.dtype(out.dtype).str
        except (TypeError, ValueError, MemoryError) as exc:
            if not comm.check:
                raise
            error = exc
        header = Header(root if isinstance(root, int) else -1, name)
        late: list = []
        result: list = []

        def make_data(desc):
            shape, dtype = tuple(desc[0]), np.dtype(desc[1])
            call = comm._call(Collective.BROADCAST, _Like(shape, dtype), None, name,
                              root=header.root)
            header.call, header.run_as = call, call.run_as
            comm.last_algorithm = call.run_as
            target, bad = comm._target(out, shape, dtype)
            if bad is not None:
                late.append(bad)
            work = target if target is not None else arrays.result(shape, dtype)
            result.append(work)
            return comm._data_stage(call, seq, src, work.reshape(-1))

        stage = Opening(comm, seq, header, known, error, make_data)

        def finish():
            if late:
                raise late[0]
            return result[0] if result else None

        return header, [stage], finish

    return build


class _Like:
    """Shape and dtype of what a broadcast moves (the validated call needs no data)."""

    def __init__(self, shape: tuple, dtype: np.dtype):
        self.shape, self.dtype = shape, dtype
        self.size = math.prod(shape)
