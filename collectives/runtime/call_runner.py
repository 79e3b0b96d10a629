"""How a Communicator's calls run: the validated call of each signature, the engine that
runs a call as an operation (agreement first, then its data stages), the stage that moves a
call's data, and the hot paths of repeated all-reduces.

One ``CallRunner`` per communicator (``comm.calls``). The communicator's method files
(``collectives.api.spmd_reductions``, ``spmd_spread``, ``spmd_copies``, ...) describe each
collective (what it takes, what it checks, and the record that returns its result,
``runtime.results``) and ask it, through these public methods, to run it; the machinery
itself lives here alone. It asks the communicator one thing, at validation: what a new call
runs as (``Communicator.choose_algorithm``, the runner list of ``collectives.api.runners``).

* ``validated(collective, x, op, algorithm, ...)``: the ``Call``, checked once per signature
  and cached, with what runs it (``Communicator.choose_algorithm``, ``api.runners``);
* ``start(what, build, async_op, timeout)``: one call, start to finish: a number, the
  agreement where the signature is new, ``build(seq)``'s stages and result record, and the
  result or a handle;
* ``data_stage(call, seq, src, work)``: the stage that moves the data, the transport's
  collective or this rank's plan of a schedule;
* ``target(out, shape, dtype)``: whether ``out`` can take a result, or the error to raise
  once the call has run (peers are not left with half a collective);
* ``hot_paths`` and ``last_hot``: the hot path of each agreed all-reduce signature
  (``collectives.runtime.hot_path``), and the one the latest call took; ``forget()`` drops
  them with the validated calls (new constants choose again).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import numpy as np

from .. import algorithms
from ..algorithms.base import Layout
from ..algorithms.schedule import Collective
from ..algorithms.spec import spec_key
from ..timeline import record_calls, recorder
from . import refusals
from .agreement import agreed, issued_alone
from .calls import BatchTag, Call, check_op_for, resolve_algorithm
from .engine import Engine
from .execute.spmd import SpmdRun
from .hot_path import FastAllReduce
from .native_stage import NativeStage, ScheduleInTurn
from .operation import Operation
from .pending_verdict import PendingVerdict
from .results import Ready
from .validate import (
    check_communicable,
    check_flag,
    check_out,
    check_root,
    check_shards,
    check_timeout,
    resolve_groups,
)

CALLS = logging.getLogger("collectives.calls")
REDUCING = frozenset({Collective.ALL_REDUCE, Collective.REDUCE, Collective.REDUCE_SCATTER})
ROOTED = frozenset({Collective.REDUCE, Collective.BROADCAST, Collective.GATHER, Collective.SCATTER})
ISSUING = object()  # ``validated``'s batch: the one ``part_of`` holds for the call issued now


class _ThreadBatch(threading.local):
    """Per thread, the batch its calls are buckets of (a class default: read at once by a
    thread that never set one)."""

    batch: BatchTag | None = None


class CallRunner:
    """The call machinery of one communicator (see the module's docstring)."""

    def __init__(self, comm: Any):
        transport = comm.transport
        self.comm = comm
        self.engine = Engine(transport, timeout=comm.timeout, check=comm.check,
                             detail=comm.debug == "detail")
        self.cache: dict[Any, Call] = {}  # call arguments (or "barrier") -> validated call
        self.hot_paths: dict[Any, FastAllReduce | None] = {}  # all-reduce args -> hot path
        self.last_hot: FastAllReduce | None = None  # the one the latest hot all-reduce took
        # per thread, the batch whose bucket the calls it validates now carry (``part_of``):
        # its tensor list joins their signatures, so ranks with different lists never pair
        # their buckets (one communicator's: another thread's batch, refused with
        # ConcurrentCallError as it overlapped, left its tag to this thread's plain calls)
        self._thread = _ThreadBatch()
        native = transport.native
        self.native_names: tuple[str, ...] = native.names if native is not None else ()
        # schedules' rounds take native turns where they share the natives' order (NCCL)
        self.rounds_in_turn = bool(transport.schedules_in_native_order)

    def forget(self) -> None:
        """Drop the validated calls and hot paths (their choices were made with constants
        that changed)."""
        self.cache.clear()
        self.hot_paths.clear()
        self.last_hot = None

    @property
    def batch(self) -> BatchTag | None:
        """The batch that the calls this thread makes now are buckets of (``part_of``)."""
        return self._thread.batch

    @contextmanager
    def part_of(self, batch: BatchTag) -> Iterator[None]:
        """The calls made inside are buckets of ``batch`` (a batch's description and digest,
        ``collectives.api.batch_checks.batch_tag``): it joins each call's signature and so the
        check value that rides with its data, and ranks that pass different tensor lists fail
        with ``CollectiveMismatchError`` on every call, not only the first."""
        outer, self._thread.batch = self.batch, batch
        self.last_hot = None  # (a plain call's hot path must not take a bucket)
        try:
            yield
        finally:
            self._thread.batch = outer

    def refuse(self, what: str, error: Exception, count: int | None = None,
               issued: int = 1) -> NoReturn:
        """Raise ``error``, a bad argument this rank found before its call was issued, the way
        a call raises one: through the agreement of each call its peers make at this point,
        so that they raise ``PeerFailedError`` naming this rank at once (where they took their
        call as agreed, a rejection notice makes them join) instead of waiting their timeout.
        ``count``: how many calls they make here (a batch's buckets, ``issued`` together);
        None: as many as they issued together (``collectives.runtime.refusals``)."""
        refusals.refuse(self, what, error, count, issued)

    def validated(self, collective: Collective, x: Any, op: Any, algorithm: Any, *, root: int = 0,
              shards: int = 0, groups: Any = None, axis: int | None = None,
              compression: str | None = None, passed: Any = None,
              rows_vary: bool = False, batch: Any = ISSUING) -> Call:
        """The validated call of these arguments, from the cache when they were seen before
        (``compression``: what a compressed call's wire call carries, ``Call.compression``;
        ``passed``: the caller's array where ``x`` is a widened copy of it, ``Call.passed``;
        ``rows_vary``: ``Call.rows_vary``; ``batch``: the batch the call is part of, where it
        is validated after its issue, on whichever thread, ``part_of``'s then being another
        call's: by default the one being issued now)."""
        batch = self.batch if batch is ISSUING else batch
        shown = None if passed is None or passed is x else np.dtype(passed.dtype)
        try:
            # (the scalars' types too: 0.0 == 0 and True == 1 would skip their checks)
            # (and the spec's and groups' parts': ("ring", 2.0) == ("ring", 2), and only one
            # is valid)
            key = (collective, x.shape, x.dtype, op, spec_key(algorithm), root, type(root),
                   shards, type(shards), spec_key(groups), axis, type(axis), batch,
                   compression, shown, rows_vary)
            call = self.cache.get(key)
        except TypeError:  # unhashable arguments (an array as groups): no cache
            key, call = None, None
        if call is None:
            call = self._validate(collective, x, op, algorithm, root, shards, groups, axis,
                                  compression, shown, rows_vary, batch)
            if key is not None:
                if len(self.cache) > 4096:
                    self.cache.clear()
                self.cache[key] = call
        return call

    def _validate(self, collective, x, op, algorithm, root, shards, groups, axis,
                  compression, shown=None, rows_vary=False, batch=None) -> Call:
        dtype = np.dtype(x.dtype)
        parsed = check_op_for(op, dtype, "x") if collective in REDUCING else None
        check_communicable(dtype, "x")
        shape = tuple(int(d) for d in x.shape)
        if collective in ROOTED:
            root = check_root(root, self.comm.size)
        shards = check_shards(shards)
        name, shards = resolve_algorithm(algorithm, math.prod(shape), shards, self.native_names)
        if name not in self.native_names and name != "auto":
            if not algorithms.supports(collective, name):
                raise ValueError(
                    f"algorithm={algorithm!r} has no {collective.value}; use 'auto' or one of "
                    f"{', '.join(algorithms.names_for(collective))}")
        layout = None
        if "/" in name or groups is not None:
            layout = (Layout(resolve_groups(groups, self.comm.size)) if groups is not None
                      else self.comm.transport.layout)
        call = Call(collective, shape, dtype, parsed, root, name, shards, layout, axis, batch,
                    compression, passed=shown, rows_vary=rows_vary)
        call.run_as = self.comm.choose_algorithm(call)
        CALLS.info("rank %d: %s runs as %s", self.comm.rank, call.describe(), call.run_as)
        return call

    def target(self, out: Any, shape: tuple, dtype: np.dtype, argument: str = "out"):
        """``(out, None)`` when ``out`` can take the result, else ``(None, its error)``: the
        call still runs (with a buffer of its own) and raises the error at the end, so peers
        are not left with half a collective."""
        if out is None:
            return None, None
        try:
            check_out(out, shape, dtype, argument, self.comm.arrays)
        except (TypeError, ValueError) as exc:
            return None, agreed(exc)
        return out, None

    def start(self, what: str, build, async_op: bool, timeout: float | None,
               subject: str | None = None, refused: BaseException | None = None,
               issued: int | None = None):
        """Run a call: ``build(seq)`` validates and returns ``(call, stages, finish)``.
        ``subject`` names the call in errors (default: the call's own description);
        ``refused``: why this rank cannot take part (``refuse``), carried as a build error,
        one of ``issued`` calls its peers' batch issues together (None: as a failing call of
        the batch being issued says, ``agreement.issued_alone``)."""
        engine = self.engine
        t0 = recorder.now() if recorder.ON else 0
        engine.enter(what, timeout)
        try:
            if async_op.__class__ is not bool:  # ("no" read as True; an array's truth raised
                try:  # on this rank alone): refused like a bad argument, peers told
                    check_flag(async_op, "async_op")
                    async_op = bool(async_op)
                except TypeError as exc:
                    refused, async_op = refused or exc, False
            if async_op and refused is None:  # too many handles unwaited here: refused like
                refused = engine.crowded()    # a bad argument (peers may have room: they hear)
            seq = engine.next_seq()
            call = data = finish = None
            error: BaseException | None = None
            try:
                timeout = check_timeout(timeout)
                if refused is None:
                    call, data, finish = build(seq)
            except Exception as exc:  # noqa: BLE001 - whatever failed here, before any data
                # moved, goes into the agreement: peers hear of it (any other type left them
                # waiting out their timeout for a call this rank never issued)
                call, data, finish, error = None, None, None, exc
                timeout = None  # (it may be the bad argument) the agreement waits the default
            except BaseException as exc:  # (Ctrl-C, SystemExit: the call's number is taken
                engine.broken_by(exc, seq)  # and never issued; the ranks are out of step)
                raise
            if refused is not None:
                error = refused
            late = getattr(finish, "late", None)
            own = getattr(call, "agrees_itself", False)
            # (COLLECTIVES_DEBUG=detail agrees on every call, whatever check= says)
            if (not self.comm.check and not engine.detail) or own:
                if error is not None:
                    engine.fail_locally(error, seq)
                    raise error
                agreement = waiting = None
            else:
                signature = call.signature if call is not None else None
                agreement = engine.agreement(seq, signature, call.check if call else 0, error,
                                             always=call is not None and call.always_agrees,
                                             issued=issued_alone(self.batch)
                                             if issued is None else issued)
                if error is not None and self.comm.size > 1:
                    engine.reject(error, seq)  # peers that skip this agreement must hear
                waiting = agreement if isinstance(agreement, PendingVerdict) else None
                if waiting is not None and late is not None:
                    waiting.fail_with(late)  # (into its agreement, should it run one)
                elif agreement is not None and late is not None:
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
            if self.comm.debug == "detail":
                CALLS.debug("rank %d: call %d: %s", self.comm.rank, seq,
                            call.describe() if call is not None else f"{what}: {error}")
            if call is not None:
                self.comm.last_algorithm = call.run_as
            # what peers see of this rank: the call, and whether it agrees on it or moves data
            # (a call waiting for verdicts moves data unless one refuses)
            phase = "agreeing" if (agreement is not None and waiting is None) or own else "moving"
            if waiting is not None:  # (before its digest goes out: NCCL holds it)
                waiting.tell_transport(self.comm.transport.verdict_pending(seq))
            self.comm.transport.publish_activity((seq, subject, phase))
            stages = [agreement, *(data or [])]
            op = Operation(engine, seq, subject, stages, finish or Ready(),
                           signature=call.signature if call else None,
                           check=call.check if call else 0,
                           skipped_agreement=phase == "moving", phase=phase,
                           timeout=timeout)
            if waiting is not None:
                waiting.belongs_to(op)
            if recorder.ON:
                record_calls.issued(self.comm, op, async_op, t0)
            result = engine.run(op, async_op, timeout)
            if not async_op:
                self.comm.transport.publish_activity((seq, subject, False))
            return result
        finally:
            engine.leave()

    def data_stage(self, call: Call, seq: int, src: Any, work: Any, *, granule: int = 1,
                    turn: int | None = None):
        """The stage that moves the data: the native collective, or this rank's plan.
        ``turn``: a place in the native start order reserved when the call was issued (for
        calls that learn their data stage later); released where no native runs."""
        op = call.op.wire_op if call.op is not None else None
        if call.run_as == "native":
            return NativeStage(self.engine, self.comm.transport.native, call, src, work,
                               op, seq, turn)
        in_order = self.rounds_in_turn
        if turn is not None and not in_order:
            self.engine.release_turn(turn)
        units = len(work) // granule if granule else 0
        shards = min(call.shards, max(units, 1))  # more sub-chunks than elements: pointless
        plan = call.plans.get(shards)
        if plan is None:  # the call keeps its plan: no lookup on later calls
            plan = call.plans[shards] = algorithms.rank_plan(
                call.collective, call.run_as, self.comm.size, self.comm.rank, root=call.root,
                shards=shards, layout=call.layout)
        run = SpmdRun(plan, work, op, self.comm.transport.data, granule=granule, seq=seq,
                      check=call.check if self.comm.check else 0,
                      src=src if src is not None and src is not work else None)
        return ScheduleInTurn(self.engine, run, turn) if in_order else run
