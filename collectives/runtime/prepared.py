"""Prepared calls: a collective bound to its buffers, started again and again.

``comm.all_reduce_init(x, op, out=out)`` (and ``reduce_init``, ``broadcast_init``,
``all_gather_init``, ``reduce_scatter_init``) validates once and returns a
``PreparedCall``; each ``start()`` reads ``x`` afresh (the caller refills it between
calls) and each ``wait()`` returns ``out`` holding the result. Arguments are agreed across
ranks as a plain call's are: at the first ``start()`` (and again after a failed agreement).
Where the transport has persistent collectives (MPI-4's ``MPI_Allreduce_init``), a prepared
call uses one; otherwise it runs this rank's cached plan over the same buffers. This is the
fastest way to call the library repeatedly on the same buffers: a small all-reduce, once
agreed, starts through the hot path (``.hot_path``) and usually completes within its
``start()``, leaving ``wait()`` nothing to do but MEAN's division.
"""

from __future__ import annotations

from typing import Any

from ..algorithms.schedule import Collective
from ..errors import CollectiveError
from .calls import Call
from .hot_path import DONE, FastAllReduce
from .validate import check_timeout


class PersistentStage:
    """Start a prepared native collective in its turn (natives start in call order)."""

    __slots__ = ("engine", "persistent", "seq", "started", "turn")

    def __init__(self, engine: Any, persistent: Any, seq: int):
        self.engine, self.persistent, self.seq = engine, persistent, seq
        self.turn = engine.reserve_turn()
        self.started = False

    def advance(self) -> bool:
        engine = self.engine
        if not self.started:
            if not engine.in_turn(self.turn):
                return False
            engine.pass_turn()
            self.persistent.start(self.seq)
            self.started = True
        return self.persistent.advance()

    def abort(self) -> None:
        if not self.started:
            self.engine.release_turn(self.turn)

    def pending_peers(self) -> list[int]:
        return [r for r in range(self.engine.size) if r != self.engine.rank]


class Finished:
    """A prepared call's run that the hot path finished: its result, for every ``wait()``."""

    __slots__ = ("result",)

    def __init__(self, result: Any):
        self.result = result


class PreparedCall:
    """A validated collective bound to ``src`` (read at each start) and ``work`` (written).

    ``finish()`` turns the work buffer into the result (MEAN's division, copies into ``out``).
    """

    def __init__(self, comm: Any, what: str, call: Call, src: Any, work: Any, finish: Any, *,
                 granule: int = 1, place: Any = None, returns: Any = None):
        # ``src`` None: the input already sits in ``work`` (in place), or ``place()`` puts it
        # there at every start (all-gather's block)
        self.comm, self.what, self.call = comm, what, call
        self.src, self.work, self.finish, self.granule = src, work, finish, granule
        self.place = place
        # what wait() hands back in place of finish's result, where the call writes a view of
        # the caller's own array (a PyTorch tensor's NumPy view: the tensor itself)
        self.returns = returns
        self._persistent = None
        self._work: Any = None  # a Work handle, DONE, or the exception the hot path met
        self._waited = True
        self._freed = False
        self._fast: FastAllReduce | None = None
        if call.run_as == "native":
            self._persistent = comm.transport.native.prepare(call, src, work, call.op.wire_op
                                                             if call.op is not None else None)
            if (self._persistent is not None and call.collective is Collective.ALL_REDUCE
                    and place is None):
                self._fast = FastAllReduce.build(comm, call, bound=self._persistent)

    def start(self) -> PreparedCall:
        """Start one run; ``wait()`` before the next ``start()``."""
        comm = self.comm
        if self._freed:
            raise CollectiveError(f"rank {comm.rank}: {self.what}: start() after free(); "
                                  "prepare the call again")
        work = self._work
        if work is not None and not self._waited:
            raise CollectiveError(f"rank {comm.rank}: {self.what}: start() again before wait(); "
                                  "wait() for the run in flight first (its buffers are the "
                                  "next run's)")
        if work is DONE or (work is not None and not self.is_completed()):  # (waited for, on
            # another thread: a run now would share the running one's buffers)
            raise CollectiveError(f"rank {comm.rank}: {self.what}: start() while the last run, "
                                  "which another thread's wait() is waiting for, is still in "
                                  "flight; start() once that wait() has returned")
        try:
            self._work, self._waited = self._issue(), False
        except BaseException as exc:  # (a wait() now raises it: the run it would wait for
            self._work, self._waited = exc, True  # never started, and the last run's ``out``
            raise  # is no result of this start's input)
        return self

    def _issue(self) -> Any:
        """Issue one run: its handle, or what the hot path gives (``_work``)."""
        comm = self.comm
        fast = self._fast
        if fast is not None:
            got = fast.start(self.finish)
            if got is not None:
                return got

        def build(seq):
            # agreed (the first time, or again after a failed agreement) and run as a plain
            # call of this signature would be; what place() copies in is the caller's input,
            # written on the caller's stream (a GPU transport's stream must wait for it)
            comm.transport.reading_inputs(seq)
            if self.place is not None:
                self.place()
            if self._persistent is not None:
                data = PersistentStage(comm.calls.engine, self._persistent, seq)
            else:
                data = comm.calls.data_stage(self.call, seq, self.src, self.work, granule=self.granule)
            return self.call, [data], self.finish

        return comm.calls.start(self.what, build, True, None)

    def wait(self, timeout: float | None = None) -> Any:
        """The result of the last ``start()`` (the bound ``out``, or None off the root)."""
        work = self._work
        if work is None:
            raise CollectiveError(f"rank {self.comm.rank}: {self.what}: wait() before start()")
        timeout = check_timeout(timeout)  # (before the run counts as waited for: a bad one ends nothing,
        self._waited = True  # and a start() after it would share the running call's buffers)
        if work is DONE:  # the hot path ran it: finished once (MEAN divides ``out`` in place),
            try:  # and every later wait() says the same
                work = self._work = Finished(self.finish())
            except BaseException as exc:
                self._work = exc
                raise
        if isinstance(work, Finished):
            result = work.result
        elif isinstance(work, BaseException):
            raise work
        else:
            try:
                result = work.wait(timeout)
            finally:
                if not work.is_completed():  # (a KeyboardInterrupt: the run is still in
                    self._waited = False  # flight, and a start() now would share its buffers)
        return result if self.returns is None else self.returns

    def is_completed(self) -> bool:
        work = self._work
        if work is DONE or isinstance(work, (Finished, BaseException)):
            return True
        return work is not None and work.is_completed()

    def free(self) -> None:
        """Release the transport's persistent request, if any. A run started and not waited
        for runs to its end first (within its deadline: it waits for its peers as ``wait()``
        would; ``wait()`` still gives its result), and its error, if it failed, is raised
        here, once the call is released; a ``start()`` after ``free()`` raises."""
        work, unwaited = self._work, not self._waited
        failed: BaseException | None = None
        if work is not None and not isinstance(work, (Finished, BaseException)):
            try:  # (freed under a run in flight, its result was never written: stale ``out``)
                self.wait()
            except Exception as exc:  # noqa: BLE001 - raised below, once released
                self._work = failed = exc
        self._freed = True
        self._fast = None
        if self._persistent is not None:
            self._persistent.free()
            self._persistent = None
        if failed is not None and unwaited:  # (nobody had asked for it: it must not be lost)
            raise failed

    def __repr__(self) -> str:
        return f"<PreparedCall {self.call.describe()}>"

