"""Broadcast and scatter as they run: an opening all-reduce that tells non-roots what they
will receive, then the data stage built from what they heard.

Non-roots may pass ``x=None``: they learn the shape and dtype (of the whole array, or of one
row for a scatter) from the root. So every broadcast (with ``check=True``) opens with one
small all-reduce over the control channel that does three things at once: the usual
agreement on what every rank knows (root, algorithm), the shape and dtype where a non-root
passed an ``x`` (it must match the root's), and the root's *descriptor* (its shape and dtype,
or its error), which reaches every rank as the maximum of the root's bytes and everyone
else's zeros. Then ``FromRoot`` validates the call every rank now knows (on a non-root, the
first call of a shape asks the communicator what it runs as then: it could not be chosen
before the descriptor came), builds its data stage, and is the call's result record.

The arguments themselves are checked by ``collectives.api.spmd_from_root``.
"""

from __future__ import annotations

import math
import pickle
import zlib
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from .agreement import PAYLOAD_BYTES, Agreement
from .calls import check_of


class Header:
    """What every rank knows of a broadcast (or scatter) before the root's descriptor arrives."""

    agrees_itself = True  # its opening stage is its agreement

    def __init__(self, root: int, algorithm: str, kind: Collective = Collective.BROADCAST,
                 batch: Any = None):
        """``batch``: what the call is part of as it is issued (``CallRunner.part_of``)."""
        self.root, self.algorithm, self.run_as = root, algorithm, ""
        self.batch = batch  # (its data stage is validated later, on whichever thread)
        self.collective = kind
        self.signature = (kind.value, None, None, None, root, algorithm, 0, None, None)
        self.check = check_of(self.signature)
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
        # every rank that knows the shape and dtype (the root, and non-roots that passed x)
        # agrees on them: a non-root's x unlike the root's is a mismatch, not ignored
        digest = zlib.crc32(repr(known).encode()) if known is not None else None
        shape = known[0] if known is not None else None
        dtype = str(from_token(known[1])) if known is not None else None  # (a Call's text)
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

    @property
    def knows_peers(self) -> bool:
        return self.data is not None and getattr(self.data, "knows_peers", False)

    def abort(self) -> None:
        if self.data is None:
            self.comm.calls.engine.release_turn(self.turn)
        for stage in (self.agreement, self.data):
            if stage is not None:
                stage.abort()


class FromRoot:
    """The data stage of a broadcast or scatter, made once the descriptor is known
    (``data_stage``), and the call's result (calling it: this rank's array, or the error of an
    ``out`` that could not take it, raised once the data has moved)."""

    late = None  # (an ``out`` that does not fit is known only once the descriptor arrives)

    def __init__(self, comm: Any, seq: int, header: Header, src: Any, out: Any, turn: int):
        self.comm, self.seq, self.header, self.src, self.out = comm, seq, header, src, out
        self.turn = turn
        self.result: Any = None
        self.out_error: BaseException | None = None

    def data_stage(self, desc: tuple) -> Any:
        comm, header = self.comm, self.header
        arrays = comm.arrays
        scatter = header.collective is Collective.SCATTER
        shape, dtype = tuple(desc[0]), from_token(desc[1])
        whole = (comm.size, *shape) if scatter else shape
        call = comm.calls.validated(header.collective, Like(whole, dtype), None,
                                    header.algorithm, root=header.root, batch=header.batch)
        header.call, header.run_as = call, call.run_as
        comm.last_algorithm = call.run_as
        target, self.out_error = comm.calls.target(self.out, shape, dtype)
        self.result = target if target is not None else arrays.result(shape, dtype)
        if not scatter:
            return comm.calls.data_stage(call, self.seq, self.src, self.result.reshape(-1),
                                         turn=self.turn)
        # the root reads its x in place; the others receive into a buffer of every row (only
        # their own rows, and those they pass on, are ever touched)
        count = call.count // comm.size
        work = self.src if self.src is not None else arrays.empty((call.count,), dtype)
        row = slice(comm.rank * count, (comm.rank + 1) * count)
        stage = comm.calls.data_stage(call, self.seq, None, work,
                                      granule=count if count else 1, turn=self.turn)
        mine = self.result.reshape(-1)
        return Then(stage, lambda: arrays.copy(mine, work[row]))

    def __call__(self) -> Any:
        if self.out_error is not None:
            raise self.out_error
        return self.result


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


class Then:
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

    @property
    def knows_peers(self) -> bool:
        return getattr(self.stage, "knows_peers", False)

    def abort(self) -> None:
        self.stage.abort()


class Like:
    """Shape and dtype of what a broadcast moves (the validated call needs no data)."""

    def __init__(self, shape: tuple, dtype: np.dtype):
        self.shape, self.dtype = shape, dtype
        self.size = math.prod(shape)
