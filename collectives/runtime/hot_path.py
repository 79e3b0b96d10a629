"""The hot path: a repeated small all-reduce, with nothing per call that can be bound once.

Training loops issue the same small all-reduce thousands of times. Once a call's signature is
agreed and it runs natively, ``FastAllReduce`` holds everything the call needs: the
validated call, the engine, and the transport's collective bound to that signature
(``PersistentNative.quick``: for MPI, a persistent all-reduce whose buffer already carries the
call's check value, so ranks that disagree still fail with ``CollectiveMismatchError``). A
call then costs a few checks of the engine's state, one copy in, one start, a short spin, one
comparison and one copy out: no lookup, no allocation (but a result's, without ``out``), no
operation object, no handle.

The communicator keeps one per signature, and calls the one its last call used without a
lookup (``Communicator.all_reduce``); prepared all-reduces (``all_reduce_init``) start
through one of their own. Anything out of the ordinary (an error, a slow peer, calls in
flight, a signature forgotten after a failed agreement) takes the engine's way instead, with
its deadlines and failure notices: a call still running when the spin ends becomes an
operation in flight like any other. A call that comes after a quiet spell first reads the
peers' notices that came meanwhile (``Failures.back_after_quiet``; about 0.1 ms on MPI, once
per spell of 50 ms or more): a peer that gave up on this very call may have sent its data
before it did.
"""

from __future__ import annotations

from typing import Any

from ..ops import ReduceOp
from ..timeline import record_fast, recorder
from .calls import Call
from .operation import Operation
from .transport import PENDING
from .work import CALLING_BACK, Completed

DONE = "done"  # what FastAllReduce.start returns for a call that completed at once


class FastAllReduce:
    """The hot path of one agreed all-reduce signature (see the module's docstring).

    ``cls``, ``dtype``, ``shape``, ``op`` and ``algorithm`` are what the caller passed the first
    time: ``Communicator.all_reduce`` compares a call's arguments with them by identity."""

    __slots__ = ("acquire", "agreed_at", "algorithm", "arrays", "bound", "call", "checked", "cls",
                 "comm", "dtype", "engine", "mean", "op", "quick", "release", "shape", "size",
                 "transport")

    def __init__(self, comm: Any, call: Call, bound: Any, x: Any, op: Any, algorithm: Any):
        self.comm, self.call, self.bound = comm, call, bound
        self.engine, self.transport, self.arrays = comm.calls.engine, comm.transport, comm.arrays
        # bound once: the engine's claim on the communicator, and the transport's hot call
        self.acquire, self.release = self.engine.busy.acquire, self.engine.busy.release
        self.quick = bound.quick
        self.cls = type(x)
        self.dtype: Any  # as the caller's array has them (compared by identity)
        self.shape: Any
        self.dtype, self.shape = (x.dtype, x.shape) if x is not None else (call.dtype, call.shape)
        self.op, self.algorithm = op, algorithm
        self.mean, self.size = call.op is ReduceOp.MEAN, comm.size
        self.checked = comm.check  # (with check=False nothing is agreed: nothing to forget)
        self.agreed_at = -1  # the engine's count of forgotten signatures when last looked

    @classmethod
    def build(cls, comm: Any, call: Call, x: Any = None, op: Any = None, algorithm: Any = None,
              bound: Any = None) -> FastAllReduce | None:
        """A hot path for ``call`` (first made with ``x``, ``op``, ``algorithm``; or a prepared
        call's, over the transport's ``bound`` collective), or None where it has none: too
        large, not native, integer MEAN, an empty array, or nothing the transport prepares."""
        native = comm.transport.native
        if (native is None or not native.persistent
                or call.run_as != "native"
                or call.nbytes > native.fast_bytes
                or call.final != call.dtype or call.passed is not None  # (integer MEAN:
                or not call.count or comm.debug == "detail"):  # its input goes as a copy)
            return None  # (persistent False: the transport has no persistent collectives)
        if bound is None:
            assert call.op is not None  # an all-reduce's
            bound = native.prepare(call, None, None, call.op.wire_op)
        if bound is None:
            return None
        return cls(comm, call, bound, x, op, algorithm)

    def _still_agreed(self) -> bool:
        """Whether this call's signature is still agreed (looked up only after the engine
        forgot some signature: a failed agreement, or the oldest of very many)."""
        engine = self.engine
        if self.checked and (not engine.is_agreed(self.call.check) or engine.ahead):
            return False  # (``ahead``: a call a peer rejected early takes the engine's way)
        self.agreed_at = engine.forgotten
        return True

    def _closed(self) -> bool:
        """Whether a call that hands back a handle must take the engine's way: the engine's
        state as ``__call__`` reads it (inline there, on the blocking hot path), and a handle
        more past the limit on those not waited for (the engine's way refuses it)."""
        engine = self.engine
        return (engine.broken is not None or engine.unreported or engine.inflight
                or engine.native_next != engine.native_issued
                or engine.crowded() is not None
                or (engine.forgotten != self.agreed_at and not self._still_agreed())
                or not self._unbroken_after_quiet())

    def _unbroken_after_quiet(self) -> bool:
        """After a quiet spell, the peers' notices that came meanwhile are read first (a
        peer's failure in this very call raises: ``Failures.back_after_quiet``, which keeps
        the time of the last call); False where one broke the communicator."""
        self.engine.back_after_quiet(self.call.collective.value)
        return self.engine.broken is None

    def __call__(self, x: Any, out: Any, timeout: float | None = None) -> Any:
        """The result of a blocking all-reduce of ``x`` (into ``out``), or None where the
        engine's way must run it (nothing was started)."""
        engine = self.engine
        if CALLING_BACK.depth or not self.acquire(False):  # (in_done_callback)
            return None  # (the engine's way raises ConcurrentCallError)
        try:
            if (engine.broken is not None or engine.unreported or engine.inflight  # (_closed,
                    or engine.native_next != engine.native_issued  # inline: a blocking call
                    or (engine.forgotten != self.agreed_at and not self._still_agreed())
                    or not self._unbroken_after_quiet()):  # makes no handle to count)
                return None
            t0 = recorder.now() if recorder.ON else 0  # (recording a timeline: the span's start)
            # (the timeout: the hang guard's, should the spin never return)
            seq = engine.hot_call(timeout)
            result = self.quick(x, out, seq)
            if result is None:
                engine.hot_call_dropped(seq)
                return None
            if result is PENDING:
                result = self._wait(seq, timeout, t0)
            else:
                if self.mean:
                    self.arrays.divide(result, self.size, out=result)
                self.comm.last_algorithm = "native"
                if engine.progress_thread is not None:  # it answers peers' questions: tell them
                    self.transport.publish_activity((seq, self.call, False))
            if t0:
                record_fast.fast_path(self, seq, t0)
            return result
        except BaseException as exc:
            engine.broken_by(exc, engine.seq)
            raise
        finally:
            self.release()

    def issue(self, x: Any, out: Any) -> Any:
        """An asynchronous all-reduce of ``x`` (into ``out``): its handle, finished where the
        transport's brief test saw the call finish (``PersistentNative.issue``), else an
        operation's in flight; or None where the engine's way must run it (nothing was
        started: as ``__call__``, and where a handle more would be refused, or a timeline is
        being recorded)."""
        engine = self.engine
        if CALLING_BACK.depth or recorder.ON or not self.acquire(False):
            return None
        try:
            if self._closed():
                return None
            seq = engine.hot_call(None)
            result = self.bound.issue(x, out, seq)
            if result is None:
                engine.hot_call_dropped(seq)
                return None
            self.comm.last_algorithm = "native"
            if result is PENDING:
                return self._operation(seq, self._delivered, True, None)
            if self.mean:
                self.arrays.divide(result, self.size, out=result)
            if engine.progress_thread is not None:  # it answers peers' questions: tell them
                self.transport.publish_activity((seq, self.call, False))
            return Completed(result, self.call.describe(), seq)
        except BaseException as exc:
            engine.broken_by(exc, engine.seq)
            raise
        finally:
            self.release()

    def start(self, finish: Any) -> Any:
        """Start a prepared all-reduce on its bound buffers (``rerun``): ``DONE`` if it
        completed at once (``finish()`` still to run), a
        ``collectives.runtime.work.Work`` handle if it is still running (its result:
        ``finish()``'s), None where the engine's way must start it, or the exception it
        failed with (the communicator is broken)."""
        engine = self.engine
        if CALLING_BACK.depth or not self.acquire(False):  # (in_done_callback)
            return None  # (the engine's way raises ConcurrentCallError)
        try:
            if self._closed():
                return None
            seq = engine.hot_call(None)
            got = self.bound.rerun(seq)
            if got is None:
                engine.hot_call_dropped(seq)
                return None
            self.comm.last_algorithm = "native"
            if got is PENDING:
                bound = self.bound

                def delivered():
                    bound.deliver()
                    return finish()

                return self._operation(seq, delivered, True, None)
            if engine.progress_thread is not None:
                self.transport.publish_activity((seq, self.call, False))
            return DONE
        except BaseException as exc:
            engine.broken_by(exc, engine.seq)
            if not isinstance(exc, Exception):
                raise
            return exc  # (wait() raises it)
        finally:
            self.release()

    def _wait(self, seq: int, timeout: float | None, t0: int = 0) -> Any:
        """A call the spin did not see finish: the engine waits for it, as for any other."""
        result = self._operation(seq, self._delivered, False, timeout, t0)
        self.comm.last_algorithm = "native"
        self.transport.publish_activity((seq, self.call, False))
        return result

    def _delivered(self) -> Any:
        """The result of a call the spin did not see finish, once it has (MEAN divided)."""
        result = self.bound.deliver()
        if self.mean:
            self.arrays.divide(result, self.size, out=result)
        return result

    def _operation(self, seq: int, finish: Any, async_op: bool, timeout: float | None,
                   t0: int = 0) -> Any:
        call = self.call
        self.transport.publish_activity((seq, call, "moving"))
        op = Operation(self.engine, seq, call, [self.bound], finish, signature=call.signature,
                       check=call.check, skipped_agreement=True, phase="moving")
        if t0:  # the call's span opens at its start; the operation records its waits in it
            record_fast.fast_waits(self, seq, t0, op)
        return self.engine.run(op, async_op, timeout)
