"""Broadcast, whose non-roots may not know what they will receive.

Non-roots may pass ``x=None``: they learn the shape and dtype from the root. So a broadcast's
agreement covers what every rank knows (root and algorithm), and a small *descriptor* (the
root's shape, dtype, or the root's error) then travels from the root down a tree before the
data does. A non-root whose own ``x`` or ``out`` does not fit receives into a buffer of its own
and raises afterwards, so no rank is left with half a broadcast.
"""

from __future__ import annotations

import math
import pickle
import zlib
from typing import Any

import numpy as np

from . import algorithms
from .agreement import agreed
from .calls import Call
from .errors import CollectiveMismatchError, PeerFailedError
from .execute.spmd import SpmdRun
from .ops import ReduceOp
from .schedule import Collective
from .validate import check_root

DESCRIPTOR_BYTES = 512


class Header:
    """What every rank knows of a broadcast before the root's descriptor arrives."""

    collective = Collective.BROADCAST
    always_agree = False

    def __init__(self, root: int, algorithm: str, run_as: str):
        self.root, self.algorithm, self.run_as = root, algorithm, run_as
        self.signature = ("broadcast", None, None, None, root, algorithm, 0, None, None)
        self.check = zlib.crc32(repr(self.signature).encode()) & ((1 << 30) - 1)
        self.call: Call | None = None

    def describe(self) -> str:
        return self.call.describe() if self.call else f"broadcast(root={self.root})"


class Descriptor:
    """The stage that carries the root's shape and dtype (or error), then builds the data
    stage; with ``check=False`` the non-roots' own ``x``/``out`` stand in for it."""

    def __init__(self, comm, seq: int, header: Header, mine: Any, error, make_data):
        self.comm, self.seq, self.header, self.make_data = comm, seq, header, make_data
        self.data = None
        self.buf = np.zeros(DESCRIPTOR_BYTES, np.uint8)
        if comm.rank == header.root:
            what = (error and f"{type(error).__name__}: {error}", mine)
            blob = pickle.dumps(what, protocol=pickle.HIGHEST_PROTOCOL)
            if len(blob) > DESCRIPTOR_BYTES:
                raise ValueError(f"x has {len(mine[0])} dimensions; too many to broadcast")
            self.buf[:len(blob)] = np.frombuffer(blob, np.uint8)
        plan = algorithms.rank_plan(Collective.BROADCAST, "tree", comm.size, comm.rank,
                                    root=header.root)
        self.run = SpmdRun(plan, self.buf, ReduceOp.SUM, comm.transport.control, seq=seq,
                           check=3) if comm.check else None
        self.known = None if comm.check else mine

    def advance(self) -> bool:
        if self.data is None:
            if self.run is not None:
                if not self.run.advance():
                    return False
                error, self.known = pickle.loads(self.buf.tobytes())
                if error is not None:
                    if self.comm.rank == self.header.root:
                        raise agreed(ValueError(error))
                    raise agreed(PeerFailedError(
                        f"rank {self.comm.rank}: broadcast call {self.seq} cannot run because "
                        f"the root, rank {self.header.root}, failed to start it: {error}"))
            self.data = self.make_data(self.known)
        return self.data.advance()

    def pending_peers(self) -> list[int]:
        stage = self.data if self.data is not None else self.run
        return stage.pending_peers() if stage is not None else []

    def abort(self) -> None:
        for stage in (self.run, self.data):
            if stage is not None:
                stage.abort()


def build_broadcast(comm, x: Any, root: int, algorithm: Any, out: Any):
    """The builder ``Communicator._start`` runs for ``comm.broadcast(...)``."""

    def build(seq):
        arrays = comm.arrays
        root_ = check_root(root, comm.size)
        mine = root_ == comm.rank
        xa = comm.adapt(x, "x") if (mine or x is not None) else None
        name = algorithm if isinstance(algorithm, str) else "auto"
        from .calls import resolve_algorithm

        name, _ = resolve_algorithm(name, 0, 0, comm._native_names)
        if name not in comm._native_names and name != "auto" and not algorithms.supports(
                Collective.BROADCAST, name):
            raise ValueError(f"algorithm={algorithm!r} has no broadcast; use 'auto' or one of "
                             f"{', '.join(algorithms.names_for(Collective.BROADCAST))}")
        header = Header(root_, name, "")
        known, error = None, None
        if mine:
            try:
                known = comm._call(Collective.BROADCAST, xa, None, name, root=root_).shape, \
                    np.dtype(xa.dtype).str
            except (TypeError, ValueError) as exc:
                error = exc
        elif not comm.check:
            like = out if out is not None else xa
            if like is None:
                raise ValueError("with check=False, non-root ranks must pass x or out (the "
                                 "shape and dtype to receive); or use check=True")
            known = tuple(like.shape), np.dtype(like.dtype).str
        late: list = []
        result: list = []

        def make_data(desc):
            shape, dtype = tuple(desc[0]), np.dtype(desc[1])
            if mine:
                xr = xa
            else:
                xr = _Like(shape, dtype)
                if xa is not None and (tuple(xa.shape), np.dtype(xa.dtype)) != (shape, dtype):
                    late.append(agreed(CollectiveMismatchError(
                        f"rank {comm.rank}: broadcast: x has shape {tuple(xa.shape)} and dtype "
                        f"{np.dtype(xa.dtype)} but the root sends {shape} {dtype}")))
            call = comm._call(Collective.BROADCAST, xr, None, name, root=root_)
            header.call, header.run_as = call, call.run_as
            comm.last_algorithm = call.run_as
            target, bad = comm._target(out, shape, dtype)
            if bad is not None:
                late.append(bad)
            work = target if target is not None and not (mine and target is xa) else (
                arrays.result(shape, dtype, like=xa))
            if mine and work is not xa:
                src = arrays.flat(xa)
            else:
                src = None
            result.append(work)
            return comm._data_stage(call, seq, src, work.reshape(-1))

        if error is not None and not comm.check:
            raise error
        stage = Descriptor(comm, seq, header, known, error, make_data)

        def finish():
            if late:
                raise late[0]
            return result[0] if result else None

        return header, [stage], finish

    return build


class _Like:
    """Shape and dtype of what a non-root will receive (it may have passed no array)."""

    def __init__(self, shape: tuple, dtype: np.dtype):
        self.shape, self.dtype = shape, dtype
        self.size = math.prod(shape)
