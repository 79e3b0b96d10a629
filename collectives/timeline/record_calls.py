"""The runtime on the timeline: calls, agreements, rounds, waits, the fast path, device rounds.

The hooks in the runtime call these functions only while ``recorder.ON`` is true (one
attribute test each, off). What they record, per communicator (a *track*: the participant's
row, ``tid = index * LANES``):

* a call as a span from issue to completion, with its signature (collective, shape, dtype,
  op, the algorithm that ran, bytes), on the communicator's track, or for an asynchronous
  call on the first free *lane* (``tid + 1 + k``), so calls in flight together never overlap
  on one track;
* inside it, each stage (the agreement, the plan, the native collective) as a span, and each
  round of the plan as a span whose args list its sends and receives with peer and bytes;
* a reduction as a complete event, and every wait as one, with ``for``: the ranks still
  pending when it ended (those whose messages it waited for);
* the fast path as one complete event (``record_fast``);
* a multi-device call on every device's row, its plan and rounds (``device_backend``).
* a point-to-point message as a call of its own (``record_messages``).

Waits never straddle the start or end of another span: a wait ends before any span begins or
ends, so the trace nests.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from . import recorder as rec

LANES = 100  # tids per communicator: its blocking track, then its asynchronous lanes
ROOTED = {"reduce", "broadcast", "gather", "scatter"}
STAGE_NAMES = {"Agreement": "agreement", "PendingVerdict": "verdict", "NativeStage": "native",
               "PersistentStage": "native", "Bound": "native", "Opening": "opening",
               "ExchangeRun": "exchange", "Then": "data", "_Message": "message"}
_current = threading.local()  # the traced operation this thread is advancing


class Track:
    """A communicator's rows: its blocking calls, and lanes for asynchronous ones."""

    __slots__ = ("control", "end", "fast", "label", "lanes", "lock", "messages", "others", "pid",
                 "tid")

    def __init__(self, comm: Any):
        pid, index = comm.trace_place
        self.pid, self.tid = pid, index * LANES
        self.label = f"comm {index} ({comm.name}, {comm.size} ranks)"
        self.lanes: list[int | None] = []  # per lane: when its last call ended; None: busy
        self.end = 0  # when the last blocking call ended
        self.lock = threading.Lock()
        self.control = comm.transport.control
        self.others = [r for r in range(comm.size) if r != comm.rank]
        self.fast = 0  # a fast-path call whose span is open (it had to wait)
        self.messages = 0  # point-to-point messages recorded (record_messages numbers them)
        rec.name_process(pid, f"rank {pid}")
        rec.name_track(pid, self.tid, self.label)

    def take_lane(self) -> tuple[int, int]:
        with self.lock:
            for k, last in enumerate(self.lanes):
                if last is not None:
                    self.lanes[k] = None
                    return self.tid + 1 + k, last
            if len(self.lanes) >= LANES - 1:  # beyond that, lanes are shared
                return self.tid + LANES - 1, 0
            self.lanes.append(None)
            k = len(self.lanes) - 1
        rec.name_track(self.pid, self.tid + 1 + k, f"{self.label} async {k + 1}")
        return self.tid + 1 + k, 0

    def give_lane(self, tid: int, ts: int) -> None:
        k = tid - self.tid - 1
        with self.lock:
            if 0 <= k < len(self.lanes):
                self.lanes[k] = ts


def track(comm: Any) -> Track:
    found = comm.__dict__.get("_trace_track")
    if found is None:
        found = comm.__dict__["_trace_track"] = Track(comm)
    return found


def describe(subject: Any, size: int) -> tuple[str, dict]:
    """A call's name and signature for the trace (kept for the call: never change it)."""
    call = subject if hasattr(subject, "nbytes") else None
    if call is not None:
        known = _described.get(call)
        if known is None or known[0] != size:
            known = _described[call] = (size, *_describe(call, size))
        return known[1], known[2]
    return _describe(subject, size)


def _describe(subject: Any, size: int) -> tuple[str, dict]:
    if isinstance(subject, str):
        return subject.split("(")[0], {"what": subject, "ranks": size}
    call = subject if hasattr(subject, "nbytes") else getattr(subject, "call", None)
    if call is None:  # a broadcast's non-root before the root described it
        kind = getattr(subject, "collective", None)  # (else a dup or split: it says its name)
        name = kind.value if kind else subject.describe()
        args: dict[str, Any] = {"collective": name, "ranks": size}
        if hasattr(subject, "root"):
            args["root"] = subject.root
        return args["collective"], args
    name = call.collective.value
    args = {"collective": name, "shape": list(call.shape), "dtype": str(call.dtype),
            "op": call.op.value if call.op is not None else None,
            "algorithm": call.run_as or call.algorithm, "bytes": call.nbytes, "ranks": size}
    if call.algorithm != args["algorithm"]:
        args["requested"] = call.algorithm
    if name in ROOTED:
        args["root"] = call.root
    return name, args


_described: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Call -> its signature


class OpTrace:
    """One traced operation: where its events go and what of it is open."""

    __slots__ = ("args", "depth", "lane", "pending", "pid", "round", "rounds", "seq", "stage",
                 "tid", "track", "waited")

    def __init__(self, track: Track, tid: int, lane: bool, seq: int, args: dict):
        self.track, self.pid, self.tid, self.lane, self.seq = track, track.pid, tid, lane, seq
        self.args = args
        self.depth = 0  # spans begun and not yet ended
        self.stage = -1
        self.rounds = 0  # rounds open (a plan's waits are its rounds')
        self.waited = 0  # when the current wait began (0: not waiting)
        self.pending: list = []
        self.round = None

    def begin(self, name: str, cat: str, args: rec.Args = None, ts: int = 0) -> None:
        rec.begin(self.pid, self.tid, name, cat, ts or rec.now(), args)
        self.depth += 1

    def end(self, args: dict | None = None) -> int:
        ts = rec.now()
        rec.end(self.pid, self.tid, ts, args)
        self.depth -= 1
        return ts

    def block(self, pending: list, index: Any = None) -> None:
        """Nothing moved: a wait begins (or goes on), for the ranks still ``pending``."""
        if not self.waited:
            self.waited = rec.now()
        self.pending, self.round = pending, index

    def unblock(self) -> None:
        if self.waited:
            ts = rec.now()
            rec.complete(self.pid, self.tid, "wait", "wait", self.waited, ts - self.waited,
                         ("for", self.pending, self.seq, self.round))
            self.waited = 0

    def closing(self, error: BaseException | None) -> dict | None:
        """The args the call's span ends with (a subclass may say more)."""
        return {"error": f"{type(error).__name__}: {error}"} if error is not None else None


def issued(comm: Any, op: Any, async_op: bool, t0: int = 0) -> None:
    """A call was issued: its span begins (at ``t0``, when the call was entered)."""
    where = track(comm)
    name, args = describe(op.subject, comm.size)
    if async_op:
        tid, last = where.take_lane()
    else:
        tid, last = where.tid, where.end
    trace = OpTrace(where, tid, async_op, op.seq, args)
    extra = f'"call":{op.seq},"async":true' if async_op else f'"call":{op.seq}'
    trace.begin(name, "call", (args, extra), ts=max(t0, last) or rec.now())
    op.trace = trace


def advance(op: Any) -> bool:
    """``Operation.advance`` with its stages on the timeline (the same steps, in order)."""
    trace = op.trace
    before = getattr(_current, "op", None)
    _current.op = trace
    try:
        while op.stage < len(op.stages):
            stage = op.stages[op.stage]
            if trace.stage != op.stage:
                trace.stage = op.stage
                trace.begin(*_stage_name(stage))
            if not stage.advance():
                if not trace.rounds:
                    pending = getattr(stage, "pending_peers", None)
                    trace.block(pending() if pending is not None else trace.track.others)
                return False
            trace.unblock()
            trace.end()
            op.stage += 1
        op.result = op.finish()
    except BaseException as exc:  # noqa: BLE001 - delivered to whoever waits, as untraced
        op.fail(exc)
        op.finished = True
        return True
    finally:
        _current.op = before
    op.finished = True
    _close(op, None)
    op.ended()
    return True


def failed(op: Any, exc: BaseException) -> None:
    """``Operation.fail``: every span of the operation ends, the call's with the error."""
    _close(op, exc)


def _close(op: Any, error: BaseException | None) -> None:
    trace = op.trace
    if trace is None or trace.depth <= 0:
        return
    trace.unblock()
    while trace.depth > 1:
        trace.end()
    args = trace.closing(error)
    if "shape" not in trace.args:  # learned while it ran (a broadcast's non-root)
        args = {**(args or {}), **describe(op.subject, trace.args.get("ranks", 0))[1]}
    ts = trace.end(args)
    if trace.lane:
        trace.track.give_lane(trace.tid, ts)
    else:
        trace.track.end = ts


def _stage_name(stage: Any) -> tuple[str, str]:
    kind = type(stage).__name__
    run = getattr(stage, "trace", None)
    if isinstance(run, RunTrace):
        return f"{run.name} plan", "stage"
    return STAGE_NAMES.get(kind, kind.strip("_").lower()), "stage"


class RunTrace:
    """An SPMD run's rounds, reductions and waits, on the track of the operation it is in."""

    __slots__ = ("itemsize", "name", "reducing", "transport", "where")

    def __init__(self, plan: Any, buf: Any, transport: Any):
        self.name, self.transport = plan.name, transport
        self.itemsize = buf.dtype.itemsize
        self.where: OpTrace | None = None
        self.reducing = 0

    def posted(self, run: Any) -> None:
        trace = self.where = getattr(_current, "op", None)
        if trace is None:
            return
        rounds, k = run.rounds, run.k
        key = (id(rounds), k, self.itemsize)
        known = _rounds.get(key)
        if known is None or known[0] is not rounds:
            if len(_rounds) > 4096:
                _rounds.clear()
            known = _rounds[key] = (rounds, *_round_args(rounds[k], self.itemsize))
        cat = "agreement" if self.transport is trace.track.control else "round"
        trace.unblock()
        trace.begin(known[1], cat, known[2])
        trace.rounds += 1

    def blocked(self, run: Any) -> None:
        trace = self.where
        if trace is not None:
            trace.block(run.pending_peers(), run.rounds[run.k][0])

    def reduce_begins(self) -> None:
        if self.where is not None:
            self.where.unblock()
            self.reducing = rec.now()

    def reduce_ends(self, src: int, elements: int) -> None:
        trace = self.where
        if trace is not None:
            ts = rec.now()
            rec.complete(trace.pid, trace.tid, "reduce", "reduce", self.reducing,
                         ts - self.reducing, ("from", src, elements * self.itemsize))

    def round_done(self, run: Any) -> None:
        trace = self.where
        if trace is not None:
            trace.unblock()
            trace.end()
            trace.rounds -= 1


_rounds: dict[tuple, tuple] = {}  # a plan's round (at one length) -> its span's name and args


def _round_args(rnd: tuple, size: int) -> tuple[str, dict]:
    index, sends, recvs = rnd[:3]  # (an SPMD run's rounds carry more: first_touch.annotate)
    return f"round {index}", {
        "round": index, "sends": [[dst, (b - a) * size] for dst, a, b, *_ in sends],
        "recvs": [[list(srcs), (b - a) * size, "reduce" if reduce else "copy"]
                  for srcs, a, b, reduce, *_ in recvs]}
