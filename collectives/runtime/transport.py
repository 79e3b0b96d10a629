"""What a transport provides to a ``Communicator``.

A transport is one module (or package) that imports the core and implements
``Transport``: who this rank is, two point-to-point channels (``data`` for collectives'
payloads, ``control`` for agreements, never matched against each other), how to wait when
nothing progresses, how to tell peers that this rank failed and hear that they did, and
optionally ``NativeCollectives`` it runs better itself (MPI's ``Iallreduce``, NCCL's
``allReduce``), which ``auto`` may prefer to the library's schedules.

Optional hooks are declared here with their defaults (``calls_may_not_return``,
``persistent``, ``holds_turn``, ...), and every bundled transport sets each one: the core
reads them as plain attributes (``tests/test_declared_hooks.py`` fails on a ``getattr`` probe).

The thread-rank transport (``collectives.backends.local``) and the MPI transport
(``collectives.backends.mpi``) are the two implementations; ``docs/architecture.md`` walks
through both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..algorithms.base import Layout
from ..algorithms.cost import Fabric
from ..arrays import ArrayBackend
from ..errors import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerFailedError,
    PeerTimeoutError,
)
from ..ops import ReduceOp
from .calls import Call
from .execute.spmd import PointToPoint

PENDING = "pending"  # what ``PersistentNative.quick`` returns for a call still running
# payloads up to this size take the hot path (``NativeCollectives.fast_bytes``' default)
FAST_BYTES = 64 << 10


def ignore_verdict(agreeing: bool) -> None:
    """``Transport.verdict_pending``'s function where nothing waits for the verdict."""


def engine_of(transport: Any) -> Any:
    """The engine running ``transport``'s calls (through ``Transport.engine``, its weak
    reference), or None: none yet, or its communicator is gone."""
    ref = transport.engine
    return ref() if ref is not None else None


def failure_kind(error: BaseException) -> str:
    """The ``Failure.kind`` of a notice telling peers of ``error``: "mismatch", "timeout",
    "lost" (this rank's transport failed a transfer with a peer: that peer, maybe others, is
    gone), or "error"."""
    return ("mismatch" if isinstance(error, CollectiveMismatchError) else
            "timeout" if isinstance(error, CollectiveTimeoutError) else
            "lost" if isinstance(error, PeerFailedError) else "error")


@dataclass(frozen=True)
class Failure:
    """A peer's notice that it failed in call ``seq``: ``kind`` is "error", "mismatch",
    "timeout", "lost" (its transport failed a transfer with a peer: an error, which a
    transport may tell fewer peers, as it does a timeout), or "exited" when the peer left (its
    program ended, or it raised outside the library) after finishing call ``seq``;
    ``message`` is its exception, as text. An exit's ``sent``: the messages the peer had
    posted, destination -> tag -> count (None: unknown); ``issued`` and ``pending``: the last
    call it issued (None: unknown, every call after ``seq`` is lost), and those still in
    flight when it left (``departures.lost_with``)."""

    rank: int
    seq: int
    kind: str
    message: str
    sent: Mapping[int, Mapping[int, int]] | None = field(default_factory=dict)
    issued: int | None = None
    pending: frozenset[int] = frozenset()

    def addressed_to(self, peer: int) -> Failure:
        """The notice as ``peer`` needs it: of the messages sent, only those to it."""
        if not self.sent:  # (none, or unknown)
            return self
        return replace(self, sent={peer: self.sent[peer]} if peer in self.sent else {})

    def error(self, text: str) -> CollectiveError:
        """The error, saying ``text``, of a call this notice ends: a mismatch, a timeout
        (``PeerTimeoutError``, both a peer's failure and a timeout)
        or another peer failure."""
        if self.kind == "mismatch":
            return CollectiveMismatchError(text)
        if self.kind == "timeout":
            return PeerTimeoutError(text, self.message)
        return PeerFailedError(text)


class NativeRun(Protocol):
    """A native collective in flight."""

    # True where the run issues more collectives as it advances and keeps the native turn
    # until it finishes (``collectives.runtime.native_stage``: NCCL's two-level path)
    holds_turn: bool = False

    def advance(self) -> bool:
        """Whether it has completed (raises its error, e.g. a mismatch its check caught)."""
        ...

    def pending_peers(self) -> list[int]:
        """The ranks it still waits for (for timeout messages; every peer where unknown)."""
        ...

    # optional: ``abandon()``, called when the call fails from outside the run (its timeout,
    # a peer's failure): issue nothing more, and keep alive what the transport may still
    # read or write (a late peer's data must not land in memory handed out again)


class NativeCollectives(Protocol):
    """Collectives a transport runs itself. ``names`` are the ``algorithm=`` spellings that
    ask for them explicitly (e.g. "native", "mpi")."""

    names: tuple[str, ...]
    # the transport's methods besides "native" that ``auto`` may price where calibration timed
    # them (MPI's "shm"), one name each
    methods: tuple[str, ...]
    # the method the latest native call ran, where there are several (MPI: "mpi", or "shm"
    # for the shared window); None where there is one: what a benchmark reports as run
    last: str | None = None
    # False where ``prepare`` always gives None (no persistent collectives at all): the hot
    # path then asks nothing and allocates nothing (``collectives.runtime.hot_path``)
    persistent: bool = True
    # the largest payload the hot path takes: 64 KiB (``FAST_BYTES``), more where the quick
    # form copies nothing (NCCL reads the caller's buffers: every size)
    fast_bytes: int = FAST_BYTES

    def supports(self, call: Call) -> bool:
        """Whether this call (collective, dtype, op) can run natively."""
        ...

    def preferred(self, call: Call) -> bool:
        """Whether ``algorithm="auto"`` should run this call natively (the transport's tuning)."""
        ...

    def start(self, call: Call, src: Any, dst: Any, op: ReduceOp, seq: int) -> NativeRun:
        """Start the collective from flat ``src`` into flat ``dst`` (they may be the same
        array, or overlap). ``call.check`` should ride with the data where the transport can
        carry it, so that ranks calling different collectives raise
        ``CollectiveMismatchError`` instead of mixing their data."""
        ...

    def prepare(self, call: Call, src: Any, dst: Any, op: ReduceOp) -> PersistentNative | None:
        """A collective bound to these buffers, to start again and again (MPI-4 persistent
        collectives); None where the transport has none for this call. A transport with
        none at all says so with ``persistent = False``, so nothing is allocated to ask."""
        ...


class PersistentNative(Protocol):
    """A prepared native collective: ``start()`` it, then ``advance()`` until True, again and
    again; ``src`` is read afresh at every start.

    A transport may also give a small all-reduce the core's hot path
    (``collectives.runtime.hot_path``): ``quick(x, out, seq)`` runs call ``seq`` on ``x``
    (an array of the call's shape and dtype) into ``out`` (None: a new array) and returns the
    result if it completes within a short spin; ``rerun(seq)`` does the same on the buffers it
    was prepared with and returns ``dst``. Either returns ``PENDING`` for a call still
    running (``advance()`` until True, then ``deliver()`` gives the result), or None, having
    started nothing, where it cannot run now. Results hold the wire op's reduction (MEAN: the
    sum; the core divides). ``for_kind(kind)`` gives the same hot path on another library's
    arrays (an array kind of ``collectives.foreign`` whose arrays the transport can read as
    they are, without adopting them), or None."""

    def start(self, seq: int) -> None: ...

    def advance(self) -> bool: ...

    def quick(self, x: Any, out: Any, seq: int) -> Any:
        """The hot path's call (see above); a transport without one returns None."""
        ...

    def issue(self, x: Any, out: Any, seq: int) -> Any:
        """``quick`` for an asynchronous call, which must not hold its caller while peers
        come: it tests briefly, then returns ``PENDING``; a transport without returns None
        (the engine's way runs the call)."""
        ...

    def free(self) -> None: ...


class SharedMemory(Protocol):
    """Memory every rank of a host maps (``Communicator.shared_empty``), where a transport's
    ranks are processes that can share it (MPI's shared windows)."""

    def allocate(self, nbytes: int) -> Any:
        """``nbytes`` of this rank's part of a new shared segment, zeroed, as a NumPy
        ``uint8`` array (collective among the ranks of each host)."""
        ...

    def algorithm_for(self, x: Any, out: Any) -> str | None:
        """What ``auto`` runs for an all-reduce of ``x`` into ``out`` where both lie in this
        memory and that pays (a name of the transport's own, in the call's signature, so
        that ranks whose arrays are not shared are told they disagree); None: ``auto``'s
        usual choice."""
        ...


class Transport(Protocol):
    """Everything a Communicator needs from the ranks it spans."""

    name: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    arrays: ArrayBackend
    data: PointToPoint
    control: PointToPoint
    # users' own messages (send/recv), tags (user tag, 0, 0, 0): between two ranks, those of
    # one tag pair in order (MPI's rule), and a cancelled receive pairs with nothing
    p2p: PointToPoint
    cost_model: Any  # collectives.algorithms.select.CostModel
    layout: Layout | None  # the node groups: the default of two-level algorithms
    native: NativeCollectives | None
    # The optional hooks, with their defaults (every bundled transport sets each explicitly;
    # the core reads them as plain attributes, never probes for them):
    # True where ``data`` and the native collectives share one issue order (NCCL: one
    # stream); the schedules' rounds then take native turns (``.native_stage``)
    schedules_in_native_order: bool = False
    # True where a call into the transport may block forever (MPI after a peer died): the
    # hang guard then ends a rank stuck well past its deadline (``.hang_guard``)
    calls_may_not_return: bool = False
    # False where every rank is a thread of one process (the cost model's "proc" links)
    processes: bool = True
    # the ranks of each host, where known (the placement ``auto`` prices); None: ``layout``'s
    nodes: Any = None
    # the cost model's constants, where the transport knows them whole (else ``cost_model``
    # within a host and ``link`` across hosts)
    fabric: Fabric | None = None
    engine: Any = None  # a weak reference to the Engine running its calls (set by the engine)
    link: Any = None  # a collectives.algorithms.select.LinkModel, or None: the default
    # memory the ranks of a host share (``SharedMemory``); None: the transport has none
    shared_memory: SharedMemory | None = None
    # how many call numbers apart two collectives in flight at once may be, where the
    # transport's messages carry only the low bits of a call's number (MPI's tags: 2**11);
    # the engine issues no call that far past one still in flight before that one is done
    # (``InFlight.make_room``). None: any
    calls_apart: int | None = None

    def idle(self, waited: float) -> None:
        """Nothing progressed for ``waited`` seconds: spin, yield or sleep accordingly."""
        ...

    def notify_failure(self, failure: Failure) -> None:
        """Tell every peer that this rank failed (best effort, never blocks for long)."""
        ...

    def poll_failure(self) -> Failure | None:
        """A peer's failure notice received since the last poll, if any."""
        ...

    def agreement_waiting(self, seq: int) -> bool:
        """Whether a peer has started the argument agreement of call ``seq`` (which this rank
        skipped: the ranks disagree about the call)."""
        ...

    def publish_activity(self, activity: tuple) -> None:
        """``(seq, call, phase)``: the call this rank is in, and whether it is "agreeing" on
        it or "moving" its data (False: it finished it), for peers' timeout messages and
        disputes. Called on every call: it must be cheap."""
        ...

    def verdict_pending(self, seq: int) -> Callable[[bool], None]:
        """Call ``seq``, issued now, waits for earlier calls' verdicts before it either moves
        its data or runs an agreement of its own (``pending_verdict``); the function returned
        is told which, once (True: it agrees). A transport that compares every call's check
        value on the side (NCCL's digests, where the data carries none) compares this one's
        once it is told, and the later calls' after it; the others return ``ignore_verdict``."""
        ...

    def issue_messages(self) -> None:
        """Point-to-point messages posted so far must go out now: a wait, or a call that is
        not a message, comes. A transport that holds posted messages to issue them together
        (NCCL, so that a receive posted before a send cannot deadlock) issues them here;
        the others send as they post, and do nothing."""
        ...

    def reading_inputs(self, seq: int) -> None:
        """Call ``seq`` reads its inputs now, before its data stage (a prepared call's start
        copies them into its buffers): a transport whose work runs on a stream of its own
        orders it after the caller's (NCCL); the others do nothing."""
        ...

    def peer_activity(self, timeout: float) -> dict[int, tuple]:
        """What other ranks say they are doing: ``(call number or None, description,
        phase)`` (phase as published; None where unknown; ``activity.SILENT`` for a peer that
        did not answer in time). A transport may leave peers out that it cannot ask safely."""
        ...

    def dup(self) -> Transport:
        """A new transport over the same ranks (collective)."""
        ...

    def split(self, color: int | None, key: int) -> Transport | None:
        """MPI_Comm_split's meaning (collective); None where ``color`` is None."""
        ...

    def free(self) -> None: ...
