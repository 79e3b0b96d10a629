"""What broadcast and scatter run: non-roots, which may not know what they will receive, hear
it from the root.

Non-roots may pass ``x=None``: they learn the shape and dtype (of the whole array, or of one
row for a scatter) from the root. So every
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

from .. import algorithms
from ..algorithms.schedule import Collective
from ..runtime.agreement import PAYLOAD_BYTES, Agreement
from ..runtime.calls import resolve_algorithm
from ..runtime.validate import check_root


class Header:
    """What every rank knows of a broadcast (or scatter) before the root's descriptor arrives."""

    agrees_itself = True  # its opening stage is its agreement

    def __init__(self, root: int, algorithm: str, kind: Collective = Collective.BROADCAST):
        self.root, self.algorithm, self.run_as = root, algorithm, ""
        self.collective = kind
        self.signature = (kind.value, None, None, None, root, algorithm, 0, None, None)
        self.check = zlib.crc32(repr(self.signature).encode()) & ((1 << 30) - 1)
        self.call = None

    def describe(self) -> str:
        return self.call.describe() if self.call else f"{self.collective.value}(root={self.root})"


class Opening:
    """The broadcast's opening all-reduce (agreement + descriptor), then its data stage."""

    def __init__(self, comm, seq: int, header: Header, known: tuple | None, error, make_data,
                 turn: int):
        self.comm, self.seq, self.header, self.make_data = comm, seq, header, make_data
        self.turn = turn
        self.data: Any = None  # the data stage, once the descriptor is known
        root = comm.rank == header.root
        blob = b""
        if root and error is None:
            blob = pickle.dumps(known, protocol=pickle.HIGHEST_PROTOCOL)
        mine = known if known is not None and not root else None
        digest = zlib.crc32(repr(mine).encode()) if mine is not None else None
        shape = known[0] if known is not None else None
        dtype = known[1] if known is not None else None
        signature = (header.signature[0], shape, dtype, *header.signature[3:])
        self.agreement = Agreement(comm.calls.engine, seq, signature, header.check, error,
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
        if self.data is None:
            self.comm.calls.engine.release_turn(self.turn)
        for stage in (self.agreement, self.data):
            if stage is not None:
                stage.abort()


def build_broadcast(comm, x: Any, root: int, algorithm: Any, out: Any):
    """The builder ``Communicator._start`` runs for ``comm.broadcast(...)``."""
    return build_rooted(comm, Collective.BROADCAST, x, root, algorithm, out)


def build_rooted(comm, kind: Collective, x: Any, root: int, algorithm: Any, out: Any, *,
                 problem: TypeError | ValueError | None = None):
    """The builder of a broadcast or a scatter: the root's ``x`` goes out whole, or one row of
    its leading axis (of length ``size``) to each rank. ``problem``: why this rank cannot take
    part (e.g. a root that could not pickle its object), told to every rank in the opening."""
    scatter = kind is Collective.SCATTER

    def build(seq: int):
        arrays = comm.arrays
        known, error, src, name, root_ = None, None, None, "auto", -1
        mine = root == comm.rank
        try:  # every error goes into the opening agreement, so that every rank hears of it
            root_ = check_root(root, comm.size)
            if problem is not None:
                raise problem
            name, _ = resolve_algorithm(algorithm, 0, 0, comm.calls.native_names)
            if name not in comm.calls.native_names and name != "auto" and not algorithms.supports(
                    kind, name):
                raise ValueError(f"algorithm={algorithm!r} has no {kind.value}; use 'auto' or one "
                                 f"of {', '.join(algorithms.names_for(kind))}")
            if mine:  # the root prepares everything it can before agreeing
                xa = comm.adapt(x, "x")
                if scatter and (len(xa.shape) == 0 or xa.shape[0] != comm.size):
                    raise ValueError(f"x has shape {tuple(xa.shape)}; scatter's x needs a leading "
                                     f"axis of length {comm.size} (one row per rank)")
                call = comm.calls.validated(kind, xa, None, name, root=root_)
                known = (call.shape[1:] if scatter else call.shape), dtype_token(call.dtype)
                if len(known[0]) > 16:
                    raise ValueError(f"x has {len(known[0])} dimensions; at most 16 broadcast")
                check_describable(known, call.dtype)
                src = arrays.flat(xa)
            elif x is not None:
                xa = comm.adapt(x, "x")
                known = tuple(xa.shape), dtype_token(xa.dtype)
            elif not comm.check:
                if out is None:
                    raise ValueError("with check=False, non-root ranks must pass x or out (the "
                                     "shape and dtype to receive); or use check=True")
                known = tuple(out.shape), dtype_token(out.dtype)
        except (TypeError, ValueError, MemoryError) as exc:
            if not comm.check:
                raise
            error = exc
        header = Header(root_, name, kind)  # -1: a root that is not a rank (every rank hears why)
        late: list = []
        result: list = []

        def make_data(desc):
            shape, dtype = tuple(desc[0]), from_token(desc[1])
            whole = (comm.size, *shape) if scatter else shape
            call = comm.calls.validated(kind, _Like(whole, dtype), None, name, root=header.root)
            header.call, header.run_as = call, call.run_as
            comm.last_algorithm = call.run_as
            target, bad = comm.calls.target(out, shape, dtype)
            if bad is not None:
                late.append(bad)
            mine_result = target if target is not None else arrays.result(shape, dtype)
            result.append(mine_result)
            if not scatter:
                return comm.calls.data_stage(call, seq, src, mine_result.reshape(-1), turn=turn)
            # the root reads its x in place; the others receive into a buffer of every row (only
            # their own rows, and those they pass on, are ever touched)
            count = call.count // comm.size
            work = src if src is not None else arrays.empty((call.count,), dtype)
            row = slice(comm.rank * count, (comm.rank + 1) * count)
            stage = comm.calls.data_stage(call, seq, None, work, granule=count if count else 1,
                                          turn=turn)
            return _Then(stage, lambda: arrays.copy(mine_result.reshape(-1), work[row]))

        # natives start in call order: this call's place is taken now, whatever it runs later
        turn = comm.calls.engine.reserve_turn()
        stage = Opening(comm, seq, header, known, error, make_data, turn)

        def finish():
            if late:
                raise late[0]
            return result[0] if result else None

        return header, [stage], finish

    return build


def dtype_token(dtype) -> str | np.dtype:
    """A dtype as any rank turns it back into it: NumPy's own as text ("<f4"), others whole
    (structured dtypes, ml_dtypes' bfloat16, float8, int4: their ``str`` is only "|V12",
    "<V1", which would make every rank's result raw bytes)."""
    dtype = np.dtype(dtype)
    return dtype.str if dtype.isbuiltin == 1 else dtype


def from_token(token: str | np.dtype) -> np.dtype:
    return np.dtype(token)


def check_describable(known: tuple, dtype: np.dtype) -> None:
    """The root's shape and dtype must fit the opening agreement (``PAYLOAD_BYTES``)."""
    size = len(pickle.dumps(known, protocol=pickle.HIGHEST_PROTOCOL))
    if size > PAYLOAD_BYTES:
        raise TypeError(f"x has dtype {dtype}, whose description takes {size} bytes; a broadcast "
                        f"or scatter tells the other ranks at most {PAYLOAD_BYTES} bytes of shape "
                        "and dtype. Send its bytes (x.view(numpy.uint8)) and view them back as "
                        "the dtype on every rank")


class _Then:
    """A data stage followed by a last local step (scatter's copy of this rank's row)."""

    def __init__(self, stage: Any, then: Any):
        self.stage, self.then, self.done = stage, then, False

    def advance(self) -> bool:
        if not self.done and self.stage.advance():
            self.then()
            self.done = True
        return self.done

    def pending_peers(self) -> list[int]:
        return self.stage.pending_peers()

    def abort(self) -> None:
        self.stage.abort()


class _Like:
    """Shape and dtype of what a broadcast moves (the validated call needs no data)."""

    def __init__(self, shape: tuple, dtype: np.dtype):
        self.shape, self.dtype = shape, dtype
        self.size = math.prod(shape)
