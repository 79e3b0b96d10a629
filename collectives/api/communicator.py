"""The SPMD API: one process (or thread) per rank, each calling the same collectives.

A ``Communicator`` wraps a transport (thread ranks, MPI, ...). Each call:

1. validates its arguments into a ``Call`` (cached: a training loop
   repeats its calls, so this is paid once per distinct call);
2. agrees with every other rank on the call the first time its signature is seen (a mismatch,
   or a rank that could not validate its arguments, raises on every rank before any data
   moves); afterwards the signature's check value rides with the data instead;
3. runs this rank's plan of the chosen algorithm (or the transport's native collective) as an
   operation that a blocking call waits for, and ``async_op=True`` returns as a handle.

Extending it: a transport implements ``collectives.runtime.transport.Transport``; the public
hooks a subclass may override are ``Communicator.choose_algorithm`` (what ``auto`` runs)
and ``Communicator.adapt`` (which arrays a call accepts).
"""

from __future__ import annotations

import logging
import math
import zlib
from typing import Any

import numpy as np

from .. import algorithms
from ..algorithms.base import Layout
from ..algorithms.schedule import Collective
from ..arrays import plain_ndarray
from ..log import configure, debug_setting
from ..runtime.agreement import agreed
from ..runtime.calls import Call, check_op_for, resolve_algorithm
from ..runtime.engine import Engine
from ..runtime.execute.spmd import SpmdRun
from ..runtime.native_stage import NativeStage, ScheduleInTurn
from ..runtime.validate import check_communicable, check_root, check_shards, check_timeout, resolve_groups
from ..runtime.work import Operation
from ..timeline import record_calls, recorder
from . import auto, runners
from .spmd_batch import BatchOps
from .spmd_copies import CopyOps
from .spmd_p2p import PointToPointOps
from .spmd_prepared import PreparedOps
from .spmd_reductions import ReductionOps
from .spmd_spread import SpreadOps
from .spmd_subcomms import SubcommOps

CALLS = logging.getLogger("collectives.calls")
REDUCING = frozenset({Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER})
ROOTED = frozenset({Collective.REDUCE, Collective.BROADCAST, Collective.GATHER, Collective.SCATTER})


class Communicator(ReductionOps, BatchOps, SpreadOps, CopyOps, PreparedOps, PointToPointOps,
                   SubcommOps, auto.ChoiceOps):
    """Collectives among ``size`` ranks; this one is ``rank``.

    Made by `collectives.init`, `collectives.run` or a backend's ``init``, rarely by hand.

    Parameters
    ----------
    transport
        What carries the bytes (``collectives.runtime.transport.Transport``).
    timeout
        Every call's default deadline, in seconds.
    check
        Agree on each call's arguments across ranks the first time a call signature is
        seen (``False`` skips it, and a mismatch then shows as a wrong length or a timeout
        instead of a clear error).
    name
        The communicator's name in messages (default: the transport's).

    Attributes
    ----------
    rank : int
        This rank, from 0.
    size : int
        How many ranks.
    local_rank, local_size : int
        This rank's place among the ranks of its node.
    last_algorithm : str or None
        What the last call ran: a canonical algorithm name, or ``"native"``.
    """

    def __init__(self, transport: Any, *, timeout: float = 300.0, check: bool = True,
                 name: str | None = None):
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.size
        self.local_rank = transport.local_rank
        self.local_size = transport.local_size
        self.name = name or transport.name
        self.timeout, self.check = float(timeout), bool(check)
        self.arrays = transport.arrays
        self.debug = debug_setting()  # read once, here: it must be the same on every rank
        configure()
        self._engine = Engine(transport, timeout=self.timeout, check=self.check,
                              detail=self.debug == "detail")
        self._calls = {}
        self._fast = {}  # all-reduce arguments -> FastAllReduce (or None: not eligible)
        self._hot = None  # the FastAllReduce the latest hot all-reduce took
        self._batches = set()  # batch layouts every rank has agreed on (batch_all_reduce)
        native = transport.native
        self._native_names = native.names if native is not None else ()
        # schedules' rounds take native turns where they share the natives' order (NCCL)
        self._rounds_in_turn = bool(transport.schedules_in_native_order)
        self.last_algorithm = None
        self._trace_place = (recorder.participant(self.rank), recorder.next_index())
        self._fabric = auto.transport_fabric(transport)
        self.placement = auto.transport_placement(transport)

    def __repr__(self) -> str:
        return f"<Communicator {self.name} rank {self.rank} of {self.size}>"

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def free(self) -> None:
        """Release what the transport holds for this communicator (collective on MPI).

        Every later call on it raises `CommunicatorBrokenError` saying it was freed.
        """
        self._engine.close()
        self.transport.free()

    # --- hooks --------------------------------------------------------------------------

    def adapt(self, x: Any, argument: str) -> Any:
        """The array a call works on (a hook a subclass may override).

        Parameters
        ----------
        x
            What the caller passed.
        argument
            Its name, for error messages.

        Returns
        -------
        Any
            Arrays of the transport's array backend as they are; scalars and array-likes as
            NumPy arrays.

        Raises
        ------
        TypeError
            ``x`` is None, a list of arrays (one array per call), or not readable as an array.
        """
        if self.arrays.owns(x):
            if x.__class__ is not np.ndarray and isinstance(x, np.ndarray):
                return plain_ndarray(x, argument)  # (np.matrix, memmap; masked: raises)
            return x
        if x is None:
            raise TypeError(f"{argument} is None; pass an array")
        if isinstance(x, (list, tuple)) and any(hasattr(v, "shape") or hasattr(v, "__array__")
                                                 for v in x):
            raise TypeError(f"{argument} is a {type(x).__name__} of arrays; a collective takes "
                            "one array (stack them yourself with numpy.stack, or use "
                            "batch_all_reduce for several tensors)")
        try:
            return np.asarray(x)
        except Exception as exc:  # noqa: BLE001 - NumPy's message is the useful part
            raise TypeError(f"{argument} cannot be read as an array: {exc}") from exc

    def adapt_batch(self, xs: Any, argument: str) -> list:
        """The arrays a batched call works on: ``adapt`` of each (a hook a subclass may
        override, to do once per batch what ``adapt`` does per call).

        Parameters
        ----------
        xs
            The caller's list of arrays.
        argument
            Its name, for error messages (``xs[3]``).

        Returns
        -------
        list
            One array of the transport's array backend per item.
        """
        return [self.adapt(x, f"{argument}[{k}]") for k, x in enumerate(xs)]

    def choose_algorithm(self, call: Call) -> str:
        """What runs ``call`` (a hook a subclass may extend): the first of the runners
        (``collectives.api.runners``) that takes it; the choice stays with the call
        (``call.choice``, which ``explain`` shows).

        Parameters
        ----------
        call
            The validated call; ``call.algorithm`` is what the caller asked for (``"auto"``
            lets the cost model choose).

        Returns
        -------
        str
            ``"native"`` (the transport's own collective) or a schedule's canonical name.
        """
        call.choice = runners.choose(self, call)
        return call.choice.run_as

    # --- calls --------------------------------------------------------------------------

    def _call(self, collective: Collective, x: Any, op: Any, algorithm: Any, *, root: int = 0,
              shards: int = 0, groups: Any = None, axis: int | None = None) -> Call:
        """The validated call, from the cache when these arguments were seen before."""
        try:
            key = (collective, x.shape, x.dtype, op, algorithm, root, shards, groups, axis)
            call = self._calls.get(key)
        except TypeError:  # unhashable arguments (a list of groups, a spec list): no cache
            key, call = None, None
        if call is None:
            call = self._validate(collective, x, op, algorithm, root, shards, groups, axis)
            if key is not None:
                if len(self._calls) > 4096:
                    self._calls.clear()
                self._calls[key] = call
        return call

    def _validate(self, collective, x, op, algorithm, root, shards, groups, axis) -> Call:
        dtype = np.dtype(x.dtype)
        parsed = check_op_for(op, dtype, "x") if collective in REDUCING else None
        check_communicable(dtype, "x")
        shape = tuple(int(d) for d in x.shape)
        if collective in ROOTED:
            root = check_root(root, self.size)
        shards = check_shards(shards)
        name, shards = resolve_algorithm(algorithm, math.prod(shape), shards, self._native_names)
        if name not in self._native_names and name != "auto":
            if not algorithms.supports(collective, name):
                raise ValueError(
                    f"algorithm={algorithm!r} has no {collective.value}; use 'auto' or one of "
                    f"{', '.join(algorithms.names_for(collective))}")
        layout = None
        if "/" in name or groups is not None:
            layout = (Layout(resolve_groups(groups, self.size)) if groups is not None
                      else self.transport.layout)
        call = Call(collective, shape, dtype, parsed, root, name, shards, layout, axis)
        call.run_as = self.choose_algorithm(call)
        CALLS.info("rank %d: %s runs as %s", self.rank, call.describe(), call.run_as)
        return call

    def _target(self, out: Any, shape: tuple, dtype: np.dtype, argument: str = "out"):
        """``(out, None)`` when ``out`` can take the result, else ``(None, its error)``: the
        call still runs (with a buffer of its own) and raises the error at the end, so peers
        are not left with half a collective."""
        if out is None:
            return None, None
        try:
            from ..runtime.validate import check_out

            check_out(out, shape, dtype, argument, self.arrays)
        except (TypeError, ValueError) as exc:
            return None, agreed(exc)
        return out, None

    def _start(self, what: str, build, async_op: bool, timeout: float | None,
               subject: str | None = None):
        """Run a call: ``build(seq)`` validates and returns ``(call, stages, finish)``.
        ``subject`` names the call in errors (default: the call's own description)."""
        engine = self._engine
        t0 = recorder.now() if recorder.ON else 0
        engine.enter(what, timeout)
        try:
            if async_op:  # too many handles unwaited: refused alike on every rank, at once
                crowded = engine.crowded()
                if crowded is not None:
                    raise crowded
            seq = engine.next_seq()
            call = data = finish = error = None
            try:
                check_timeout(timeout)
                if error is None:
                    call, data, finish = build(seq)
            except (TypeError, ValueError, MemoryError) as exc:
                call, data, finish, error = None, None, None, exc
                timeout = None  # (it may be the bad argument) the agreement waits the default
            late = getattr(finish, "late", None)
            own = getattr(call, "agrees_itself", False)
            if not self.check or own:
                if error is not None:
                    engine.fail_locally(error, seq)
                    raise error
                agreement = None
            else:
                signature = call.signature if call is not None else None
                agreement = engine.agreement(seq, signature, call.check if call else 0, error)
                if error is not None and self.size > 1:
                    engine.reject(error, seq)  # peers that skip this agreement must hear
                if agreement is not None and late is not None:
                    # agreed only now: the bad ``out`` goes into the agreement, nothing moves
                    agreement.fail_with(late)
                    for stage in data or ():
                        abort = getattr(stage, "abort", None)
                        if abort is not None:  # e.g. give back a native turn it reserved
                            abort()
                    data = None
                # (agreed before, a bad ``out`` makes this rank run with a buffer of its own
                # and raise at the end: its peers get their results)
            subject = subject or (call if call is not None else what)
            if self.debug == "detail":
                CALLS.debug("rank %d: call %d: %s", self.rank, seq,
                            call.describe() if call is not None else f"{what}: {error}")
            if call is not None:
                self.last_algorithm = call.run_as
            # what peers see of this rank: the call, and whether it agrees on it or moves data
            phase = "agreeing" if agreement is not None or own else "moving"
            self.transport.publish_activity((seq, subject, phase))
            stages = [agreement, *(data or [])]
            op = Operation(engine, seq, subject, stages, finish or _nothing,
                           signature=call.signature if call else None,
                           check=call.check if call else 0,
                           skipped_agreement=agreement is None and not own, phase=phase)
            if recorder.ON:
                record_calls.issued(self, op, async_op, t0)
            result = engine.run(op, async_op, timeout)
            if not async_op:
                self.transport.publish_activity((seq, subject, False))
            return result
        finally:
            engine.leave()

    def _data_stage(self, call: Call, seq: int, src: Any, work: Any, *, granule: int = 1,
                    turn: int | None = None):
        """The stage that moves the data: the native collective, or this rank's plan.
        ``turn``: a place in the native start order reserved when the call was issued (for
        calls that learn their data stage later); released where no native runs."""
        op = call.op.wire_op if call.op is not None else None
        if call.run_as == "native":
            return NativeStage(self._engine, self.transport.native, call, src, work,
                               op, seq, turn)
        in_order = self._rounds_in_turn
        if turn is not None and not in_order:
            self._engine.release_turn(turn)
        units = len(work) // granule if granule else 0
        shards = min(call.shards, max(units, 1))  # more sub-chunks than elements: pointless
        plan = call.plans.get(shards)
        if plan is None:  # the call keeps its plan: no lookup on later calls
            plan = call.plans[shards] = algorithms.rank_plan(
                call.collective, call.run_as, self.size, self.rank, root=call.root,
                shards=shards, layout=call.layout)
        run = SpmdRun(plan, work, op, self.transport.data, granule=granule, seq=seq,
                      check=call.check if self.check else 0,
                      src=src if src is not None and src is not work else None)
        return ScheduleInTurn(self._engine, run, turn) if in_order else run

    def barrier(self, timeout: float | None = None) -> None:
        """Return once every rank has arrived.

        Parameters
        ----------
        timeout
            Seconds to wait for the others (None: the communicator's timeout).

        Raises
        ------
        CollectiveTimeoutError
            Ranks did not arrive in time; the message names them.
        CollectiveMismatchError
            Another rank called another collective.
        """
        def build(seq):
            call = self._barrier_call()
            token = np.zeros(1, np.int64)
            return call, [self._data_stage(call, seq, None, token)], _nothing

        self._start("barrier", build, False, timeout, subject="barrier")

    def _barrier_call(self) -> Call:
        """A barrier is a one-element all-reduce with a signature of its own (so that a rank in
        a barrier and one in an all-reduce are told they disagree)."""
        call = self._calls.get("barrier")
        if call is None:
            call = self._call(Collective.ALL_REDUCE, _TOKEN, "max", "rechd")
            barrier = Call(Collective.ALL_REDUCE, call.shape, call.dtype, call.op, 0, "rechd", 0,
                           None)
            barrier.signature = ("barrier",) + (None,) * 8
            barrier.check = zlib.crc32(b"barrier") & ((1 << 30) - 1)
            barrier.run_as = "rechd"
            call = self._calls["barrier"] = barrier
        return call


_TOKEN = np.zeros(1, np.int64)


def _nothing() -> None:
    return None
