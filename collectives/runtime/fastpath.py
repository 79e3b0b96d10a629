"""The hot path: a repeated small all-reduce with nothing per call that can be cached.

Training loops issue the same small all-reduce thousands of times. Once a call's signature is
agreed and it runs natively, :class:`FastAllReduce` keeps everything the call needs: the
validated call, a persistent native collective bound to scratch buffers of the library's own
(the input is copied in, the result out: for small payloads two copies cost less than any
per-call setup), and the result's shape. A call then costs one copy in, one start, a short
spin, one copy out. The check value rides in the scratch buffer with the data (the transport's
business), so ranks that disagree still fail with ``CollectiveMismatchError``.

Anything out of the ordinary (an error, a slow peer, calls in flight) leaves the spin for the
engine's waiting loop, with its deadlines and failure notices.
"""

from __future__ import annotations

import time
from typing import Any

from ..ops import ReduceOp
from ..timeline import recorder
from . import tracing
from .calls import Call
from .prepared import PersistentStage
from .work import Operation

FAST_BYTES = 64 << 10  # payloads up to this size take the copy-in, copy-out fast path
SPIN_SECONDS = 20e-6  # spin this long on the request before handing over to the engine


class FastAllReduce:
    """A prepared all-reduce over scratch buffers, for calls whose signature was agreed."""

    __slots__ = ("arrays", "call", "comm", "dst", "persistent", "shape", "src", "mean")

    def __init__(self, comm: Any, call: Call, persistent: Any, src: Any, dst: Any):
        self.comm, self.call, self.persistent = comm, call, persistent
        self.src, self.dst = src, dst
        self.arrays, self.shape = comm.arrays, call.shape
        self.mean = call.op is ReduceOp.MEAN

    @classmethod
    def build(cls, comm: Any, call: Call) -> FastAllReduce | None:
        """A fast path for ``call``, or None where it has none (too large, not native,
        integer MEAN, or no persistent collective in the transport)."""
        native = comm.transport.native
        if (native is None or not getattr(native, "persistent", True)
                or call.run_as != "native" or call.nbytes > FAST_BYTES
                or call.final != call.dtype or not call.count):
            return None  # (persistent False: the transport has no persistent collectives)
        arrays = comm.arrays
        src = arrays.empty((call.count,), call.dtype)
        dst = arrays.empty((call.count,), call.dtype)
        persistent = native.prepare(call, src, dst, call.op.wire_op)
        if persistent is None:
            return None
        return cls(comm, call, persistent, src, dst)

    def __call__(self, x: Any, out: Any, timeout: float | None) -> Any:
        comm = self.comm
        engine = comm._engine
        arrays = self.arrays
        t0 = recorder.now() if recorder.ON else 0
        engine.enter("all_reduce")
        try:
            seq = engine.next_seq()
            comm.transport.publish_activity((seq, self.call, True))
            arrays.copy(self.src, x.reshape(-1))
            persistent = self.persistent
            if engine.native_next != engine.native_issued or engine.inflight:
                return self._slow(seq, out, timeout)  # natives must start in call order
            engine.native_next += 1
            engine.native_issued += 1
            persistent.start(seq)
            deadline = time.perf_counter() + SPIN_SECONDS
            while not persistent.advance():
                if time.perf_counter() > deadline:
                    op = Operation(engine, seq, self.call, [_Started(persistent)],
                                   lambda: None, signature=self.call.signature,
                                   check=self.call.check, skipped_agreement=True)
                    if t0:
                        tracing.fast_waits(self, seq, t0, op)
                    engine.run(op, False, timeout)
                    break
            comm.transport.publish_activity((seq, self.call, False))
            comm.last_algorithm = "native"
            return self._result(out)
        except BaseException as exc:
            engine._broke(exc, engine.seq)
            raise
        finally:
            if t0:
                tracing.fast_path(self, engine.seq, t0)
            engine.leave()

    def _slow(self, seq: int, out: Any, timeout: float | None) -> Any:
        stage = PersistentStage(self.comm._engine, self.persistent, seq)
        op = Operation(self.comm._engine, seq, self.call, [stage], lambda: None,
                       signature=self.call.signature, check=self.call.check,
                       skipped_agreement=True)
        self.comm._engine.run(op, False, timeout)
        return self._result(out)

    def _result(self, out: Any) -> Any:
        arrays = self.arrays
        result = out if out is not None else arrays.result(self.shape, self.call.dtype)
        if self.mean:
            arrays.divide(self.dst.reshape(self.shape), self.comm.size, out=result)
        else:
            arrays.copy(result.reshape(-1), self.dst)
        return result


class _Started:
    """A persistent collective already started: advance it to completion."""

    __slots__ = ("persistent",)

    def __init__(self, persistent: Any):
        self.persistent = persistent

    def advance(self) -> bool:
        return self.persistent.advance()
