"""A call bound to its buffers (``prepare``), and the hot path of a repeated small all-reduce.

Every ``start`` of a bound call runs as a plain call of its signature would, so prepared,
hot and plain calls of one signature run the same MPI operations on every rank, whichever
path each rank takes (MPICH pairs persistent requests only with each other).

A small all-reduce whose check rides in its data (``rider.py``) also has ``Bound.quick``,
the whole call in one go once its persistent entry exists: one copy of the input into the
entry's buffer and of this rank's check trailer (a few bytes, made once) behind it, one
``Start`` (in place), ``Test`` in a short spin, one comparison of the reduced trailer with
the bytes every rank expects, one copy of the result out. Everything it touches is bound
beforehand (the request, views of the entry's buffer in the call's shape, both trailers), so
a call looks nothing up and allocates nothing but a new result where the caller passed no
``out``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from collectives.algorithms.schedule import Collective
from collectives.ops import ReduceOp
from collectives.runtime.calls import Call, pairing_key
from collectives.runtime.transport import PENDING

from . import compiled
from .compiled import MISMATCH, RAN, REFUSED, RUNNING
from .kind_path import HostPointers, KindBound
from .persistent import Entry, PersistentRun
from .runs import STALL_POLLS, mpi_error, note_stall

SPIN_SECONDS = 20e-6  # quick() spins this long on its request, then yields between tests...
HOLD_SECONDS = 1e-3  # ...until this long (the engine's wait answers peers' questions after it)
# an asynchronous call's issue (``issue``) tests its request this long and no more: peers in
# step finish a small all-reduce within it, and a caller whose peers are late goes on at once
ISSUE_SECONDS = 5e-6


class Bound:
    """A call bound to ``src`` and ``dst`` (``prepare``): ``start`` runs it as a plain call
    would; ``quick`` runs a hot small all-reduce on any input of the call's shape."""

    __slots__ = ("call", "compiled", "compiled_issue", "dst", "dst_bytes", "entry", "expected",
                 "head", "head_bytes",
                 "lane", "mine", "natives", "op", "out", "polls", "req", "result", "result_bytes",
                 "run", "seq", "since", "src", "src_bytes", "tail", "trailer", "__weakref__")

    def __init__(self, natives: Any, call: Call, src: Any, dst: Any, op: ReduceOp | None):
        self.natives, self.call, self.src, self.dst, self.op = natives, call, src, dst, op
        self.lane = natives.lane
        self.run: Any = None
        self.entry: Entry | None = None  # the hot path's entry, once a run has shown it
        self.req: Any = None  # its request and views, bound once it exists (_bind)
        self.out: Any = None  # where a PENDING quick run delivers
        self.compiled: Any = None  # the compiled hot path (compiled.py), where there is one
        self.compiled_issue: Any = None  # the same, testing briefly (``issue``)
        self.seq = self.polls = 0
        self.since = 0.0

    # --- the plain way ----------------------------------------------------------------------

    def start(self, seq: int) -> None:
        self.run = run = self.natives.start(self.call, self.src, self.dst, self.op, seq)
        if self.entry is None and isinstance(run, PersistentRun):
            self._learn(run.entry)

    def _learn(self, entry: Entry) -> None:
        # entries that may need a NaN repair scan every input for NaN: not hot
        if (entry.rider is not None and entry.collective is Collective.ALL_REDUCE
                and not entry.nan):
            self.entry = entry

    # --- the hot way ------------------------------------------------------------------------

    def for_kind(self, kind: Any) -> KindBound | None:
        """This call's hot path on another library's host arrays (PyTorch CPU tensors),
        through their addresses (``kind_path``), where the kind tells them (``HostPointers``);
        a MEAN's division stays with the engine's way (it divides NumPy arrays)."""
        if self.call.op is ReduceOp.MEAN or not isinstance(kind, HostPointers):
            return None
        return KindBound(self, kind)

    def quick_at(self, src: int, dst: int, landing: Any, seq: int) -> Any:
        """``quick`` from address ``src`` into address ``dst`` (the call's bytes each,
        C-contiguous: the caller checked) through the compiled path: True once done,
        ``PENDING`` (``landing()``: a NumPy view of ``dst``, where ``deliver`` writes), or
        None where the hot path is closed or not compiled (nothing started)."""
        entry = self.entry
        if entry is None or entry.owner is not None or self.lane.runs or self.req is None:
            return self._closed()
        self.natives.last = "mpi"  # (MPI's own, persistent: what a benchmark reports as run)
        compiled = self.compiled
        if compiled is None:
            return None
        self.seq = seq
        code = compiled.run_at(src, dst)
        if code == RAN:
            return True
        return self._landed(code, landing())

    def quick(self, x: Any, out: Any, seq: int, brief: bool = False) -> Any:
        """Run call ``seq`` on ``x`` (an array of the call's shape and dtype) into ``out`` (the
        same, C-contiguous and writable; None: a new array). Returns the result; or
        ``PENDING`` when the spin ran out (then ``advance()`` until True, then
        ``deliver``); or None, having done nothing, where the hot path is closed: no
        entry yet, the entry busy, earlier runs queued, or an ``out`` it cannot write.
        ``brief``: test for ``ISSUE_SECONDS`` only (``issue``)."""
        entry = self.entry
        if entry is None or entry.owner is not None or self.lane.runs or self.req is None:
            return self._closed()
        self.natives.last = "mpi"  # (MPI's own, persistent: what a benchmark reports as run)
        if out is not None:
            compiled = self.compiled_issue if brief else self.compiled
            if compiled is not None:
                self.seq = seq
                code = compiled.run(x, out)
                if code == RAN:
                    return out
                if code != REFUSED:
                    return self._landed(code, out)
            if not out.flags.carray:
                return None  # read-only or strided: the plain path says why
        self.head[...] = x
        self.tail[:] = self.mine  # (in place: the last run's reduced trailer is there)
        self.seq = seq
        req = self.req
        try:
            req.Start()
            if not req.Test() and self._spin(req, brief):
                self.out = out
                return PENDING
        except MPI.Exception as exc:
            raise self._failed(exc) from exc
        if self.trailer != self.expected:
            entry.verify(self.natives.rank, seq)  # raises, saying why
        if out is None:
            return self.result.copy()
        out[...] = self.result
        return out

    def issue(self, x: Any, out: Any, seq: int) -> Any:
        """``quick`` for an asynchronous call: it tests its request for ``ISSUE_SECONDS``
        only, then hands it over (``PENDING``): its caller goes on while its peers come."""
        return self.quick(x, out, seq, True)

    def rerun(self, seq: int) -> Any:
        """``quick`` on the buffers this call was prepared with (``dst`` holds the input
        where ``src`` is None), copied through byte views bound once: returns ``dst``,
        ``PENDING`` or None as ``quick`` does."""
        entry = self.entry
        if entry is None or entry.owner is not None or self.lane.runs or self.req is None:
            return self._closed()
        self.natives.last = "mpi"  # (MPI's own, persistent: what a benchmark reports as run)
        compiled = self.compiled
        if compiled is not None:
            self.seq = seq
            code = compiled.run(self.src_bytes, self.dst_bytes)
            if code == RAN:
                return self.dst
            if code != REFUSED:
                return self._landed(code, self.dst)
        self.head_bytes[:] = self.src_bytes
        self.tail[:] = self.mine
        self.seq = seq
        req = self.req
        try:
            req.Start()
            if not req.Test() and self._spin(req):
                self.out = self.dst
                return PENDING
        except MPI.Exception as exc:
            raise self._failed(exc) from exc
        if self.trailer != self.expected:
            entry.verify(self.natives.rank, seq)
        self.dst_bytes[:] = self.result_bytes
        return self.dst

    def deliver(self) -> Any:
        """The result of the last quick run that was ``PENDING``, once ``advance()`` said it is
        complete: its trailer checked (raises ``CollectiveMismatchError`` unless every rank
        had this call), copied into its ``out``."""
        assert self.entry is not None  # a quick run's: it had its entry
        if self.trailer != self.expected:
            self.entry.verify(self.natives.rank, self.seq)
        out = self.out
        if out is None:
            return self.result.copy()
        out[...] = self.result.reshape(out.shape)
        return out

    def _landed(self, code: int, out: Any) -> Any:
        """What the compiled run's ``code`` says: still running (the engine tests it from now
        on), another call's trailer (raises), or MPI's error (raises)."""
        assert self.entry is not None  # a quick run's: it had its entry
        if code == RUNNING:
            self.entry.owner = self
            self.run, self.polls, self.since = None, 0, 0.0
            self.natives.inflight[self.seq] = self.call
            self.out = out
            return PENDING
        if code == MISMATCH:
            self.entry.verify(self.natives.rank, self.seq)  # raises, saying why
        raise self._failed(MPI.Exception(-code))

    def _spin(self, req: Any, brief: bool = False) -> bool:
        """Test ``req``: spinning for ``natives.spin`` seconds, then yielding the core between tests
        (a peer on this core must run) until ``HOLD_SECONDS``, as the engine's wait would
        before it looks around (``brief``: for ``ISSUE_SECONDS`` only); True (the request
        handed to the engine) if still running."""
        now = time.perf_counter()
        spin, hold = ((now + ISSUE_SECONDS,) * 2 if brief else
                      (now + self.natives.spin, now + HOLD_SECONDS))
        while not req.Test():
            now = time.perf_counter()
            if now > spin:
                if now > hold:
                    assert self.entry is not None  # a quick run's: it had its entry
                    self.entry.owner = self  # (until now no one else could look at it)
                    self.run, self.polls, self.since = None, 0, 0.0
                    self.natives.inflight[self.seq] = self.call
                    return True
                os.sched_yield()
        return False

    def _failed(self, exc: Any) -> Exception:
        assert self.entry is not None  # a quick run's: it had its entry
        self.entry.owner = self  # MPI may still hold the request
        return mpi_error(self.natives.rank, self.seq, self.call, exc)

    def _closed(self) -> None:
        """The hot path cannot run now; bind it once the entry exists."""
        entry = self.entry
        if entry is None:  # the entry of this signature, once a plain call has made it
            entry = self.natives.entries.entries.get(pairing_key(self.call.signature))
            if entry is not None:
                self._learn(entry)
        elif self.req is None and entry.data_req is not None:
            self._bind(entry)
        return None

    def _bind(self, entry: Entry) -> None:
        assert entry.rider is not None  # _learn takes entries with a rider only
        shape = self.call.shape
        self.head = entry.head.reshape(shape)
        self.result = entry.result.reshape(shape)
        self.trailer = entry.trailer.view(np.uint8).data
        self.expected = entry.rider.expected
        self.tail = entry.tail.view(np.uint8).data
        mine = np.empty_like(entry.tail)
        entry.rider.fill(mine, False)
        self.mine = mine.tobytes()  # this rank's trailer, written before every start
        self.compiled = compiled.bind(entry, self.mine, self.natives.spin, HOLD_SECONDS)
        self.compiled_issue = compiled.bind(entry, self.mine, ISSUE_SECONDS, ISSUE_SECONDS)
        self.head_bytes = entry.head.view(np.uint8).data
        self.result_bytes = entry.result.view(np.uint8).data
        if self.dst is not None:  # prepared: its buffers are C-contiguous
            self.dst_bytes = memoryview(self.dst.reshape(-1).view(np.uint8))
            src = self.src if self.src is not None else self.dst
            self.src_bytes = memoryview(src.reshape(-1).view(np.uint8))
        self.req = entry.data_req  # (last: the hot path opens once all is bound)

    # --- progress (either way) ----------------------------------------------------------------

    def advance(self) -> bool:
        run = self.run
        if run is not None:
            return run.advance()
        try:
            done = self.req.Test()
        except MPI.Exception as exc:
            self.natives.inflight.pop(self.seq, None)
            raise mpi_error(self.natives.rank, self.seq, self.call, exc) from exc
        if not done:
            self.polls += 1
            if self.polls % STALL_POLLS == 0:
                self._stalled()
            return False
        assert self.entry is not None  # a quick run handed over: it had its entry
        self.entry.owner = None
        self.natives.inflight.pop(self.seq, None)
        return True

    def _stalled(self) -> None:
        note_stall(self)

    def pending_peers(self) -> list[int]:
        natives = self.natives
        return [r for r in range(natives.size) if r != natives.rank]

    def free(self) -> None:
        self.run = None
