"""Ranks as threads of one process: the embedded SPMD transport.

A ``ThreadTransport`` is one rank's view of a ``ThreadWorld`` (``world.py``: the mailboxes,
and the channels the schedules' messages take through them). Waiting ranks sleep on a
condition that every message, release or failure notice addressed to them wakes. ``run``
starts the ranks; ``init`` makes a world of one.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from collectives import Communicator
from collectives.algorithms.select import CostModel
from collectives.arrays import NUMPY
from collectives.errors import CollectiveTimeoutError, CommunicatorBrokenError, PeerFailedError
from collectives.runtime.activity import describe_activity
from collectives.runtime.departures import exit_notice
from collectives.runtime.transport import Failure, engine_of, ignore_verdict
from collectives.runtime.validate import check_function

from .p2p import ThreadMessages
from .world import ThreadChannel, ThreadWorld

IDLE_SLICE = 0.05  # a sleeping rank re-checks (deadlines, notices) at least this often


class ThreadTransport:
    """One thread rank's transport in a ``ThreadWorld``."""

    name = "local"
    arrays = NUMPY
    cost_model = CostModel(latency=30e-6, seconds_per_byte=1 / 8e9, message_overhead=20e-6)
    layout = None
    native = None
    local_rank = 0
    processes = False  # every rank is a thread of this process (the cost model's "proc" links)
    # the transport's optional hooks (``collectives.runtime.transport``), as their defaults
    nodes = fabric = link = shared_memory = None  # (threads share one process's memory anyway)
    calls_apart = None  # (a call's messages carry its whole number)
    schedules_in_native_order = calls_may_not_return = False

    def __init__(self, world: ThreadWorld, rank: int):
        self.world, self.rank, self.size = world, rank, world.size
        world.transports[rank] = weakref.ref(self)  # (peers read its calls in flight)
        self.engine: Any = None  # (a weak reference to the engine, set by it, as MPI's)
        self.local_size = world.size
        self.local_rank = rank
        self.data = ThreadChannel(world, rank, "data")
        self.control = ThreadChannel(world, rank, "control")
        self.p2p = ThreadMessages(world, rank)
        self._seen_events = 0
        self._seen_notices = 0
        self._children = itertools.count()
        self._kids: list[weakref.ref] = []  # this rank's transports in descendant worlds
        # the transport that lists them: the one in the run's world (None: this one)
        self.root: ThreadTransport | None = None
        self._kids_lock = threading.Lock()  # (two threads of a rank may make children at once)
        self.freed = False

    def idle(self, waited: float) -> None:
        world = self.world
        with world.lock:
            if world.events[self.rank] == self._seen_events:
                world.conds[self.rank].wait(IDLE_SLICE)
            self._seen_events = world.events[self.rank]

    def notify_failure(self, failure: Failure) -> None:
        with self.world.lock:
            self.world.notices.append(failure)
            self.world.wake_all()

    def poll_failure(self) -> Failure | None:
        notices = self.world.notices
        while self._seen_notices < len(notices):
            failure = notices[self._seen_notices]
            self._seen_notices += 1
            if failure.rank != self.rank:
                return failure
        return None

    def agreement_waiting(self, seq: int) -> bool:
        return self.world.agreeing.get((self.rank, seq), 0) > 0

    def publish_activity(self, activity: Any) -> None:
        self.world.activity[self.rank] = activity

    def verdict_pending(self, seq: int) -> Callable[[bool], None]:
        """Nothing compared on the side: a call's data carries its check value."""
        return ignore_verdict

    def issue_messages(self) -> None:
        """Nothing held: a message is posted as it is sent."""

    def reading_inputs(self, seq: int) -> None:
        """Nothing to order: a thread rank's work runs on the calling thread."""

    def peer_activity(self, timeout: float) -> dict[int, tuple]:
        world = self.world
        return {r: describe_activity(world.activity[r], _checks_in_flight(world.transports[r]))
                for r in range(self.size) if r != self.rank}

    def dup(self) -> ThreadTransport:
        child = self._child(("dup", next(self._children)), self.size)
        return self._kid(ThreadTransport(child, self.rank))

    def split(self, color: int | None, key: int) -> ThreadTransport | None:
        """MPI_Comm_split among the threads: every rank posts (color, key), then joins its
        color's new world, ranked by (key, old rank)."""
        index = next(self._children)
        table = self._child(("split", index), self.size)
        world = table  # a scratch world whose activity slots collect the posts
        with world.lock:
            world.activity[self.rank] = (color, key)
            world.events[0] += 1
            world.conds[0].notify_all()
            while any(a is None for a in world.activity):
                if not world.conds[0].wait(self.world.timeout):
                    missing = [r for r, a in enumerate(world.activity) if a is None]
                    raise CollectiveTimeoutError("split", missing, self.world.timeout, self.rank)
            posts = list(world.activity)
        if color is None:
            return None
        members = sorted((k, r) for r, (c, k) in enumerate(posts) if c == color)
        ranks = [r for _, r in members]
        child = self._child(("color", index, color), len(ranks))
        return self._kid(ThreadTransport(child, ranks.index(self.rank)))

    def _child(self, key: tuple, size: int) -> ThreadWorld:
        """The child world ``key`` of ``size`` members: made by the first to come, and no
        longer held here once every member has it."""
        world = self.world
        with world.lock:
            entry = world.children.get(key)
            if entry is None:
                entry = world.children[key] = [ThreadWorld(size, world.timeout), 0]
            entry[1] += 1
            if entry[1] == size:
                del world.children[key]
            return entry[0]

    def _kid(self, kid: ThreadTransport) -> ThreadTransport:
        """Remember a descendant transport of this rank (weakly, in the run's world's
        transport: a child dropped between would otherwise hide its own children): if this
        rank's own code raises, its peers in every descendant world must hear it too."""
        root = kid.root = self.root or self
        with root._kids_lock:
            root._kids = [ref for ref in root._kids if (k := ref()) is not None and not k.freed]
            root._kids.append(weakref.ref(kid))
        return kid

    def tell_exit(self, seq: int, message: str) -> None:
        """This rank's own code raised after call ``seq``: tell this world, and every
        descendant world it is still in (each after the last call this rank finished there;
        the run's world's transport lists them all, ``_kid``)."""
        self.notify_failure(exit_notice(self, seq, message))  # (with the messages it sent)
        for ref in self._kids:
            kid = ref()
            if kid is not None and not kid.freed:
                engine = engine_of(kid)
                if engine is not None:
                    through = engine.finished_through()
                else:  # (its communicator is gone: what it last published)
                    last = kid.world.activity[kid.rank]  # (seq, call, phase): False: done
                    through = 0 if last is None else last[0] - (1 if last[2] else 0)
                kid.tell_exit(through, message)

    def free(self) -> None:
        """Nothing to release: thread worlds go with their threads."""
        self.freed = True



def _checks_in_flight(ref: Any) -> dict[int, int] | None:
    """The check values of the calls in flight of the transport ``ref`` refers to (None: it
    has no engine, or is gone)."""
    transport = ref() if ref is not None else None
    engine = engine_of(transport) if transport is not None else None
    return engine.checks_in_flight() if engine is not None else None


def run(fn: Callable[..., Any], size: int, *, timeout: float = 60.0, args: tuple = (),
        check: bool = True) -> list:
    """Call ``fn(comm, *args)`` on ``size`` thread ranks; return their results in rank order.

    An exception in any rank is re-raised here (the lowest failing rank's; the others are
    told a peer failed instead of hanging). A rank whose function returns has left: a peer
    that waits for it in a later collective is told so at once, as when an MPI rank's
    program ends.
    """
    check_function(fn, "fn", "a function of the communicator, fn(comm, *args)")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args={args!r} must be a tuple of fn's arguments after comm")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size={size!r} must be a positive number of ranks")
    world = ThreadWorld(size, timeout)
    results: list = [None] * size
    errors: dict[int, BaseException] = {}

    def body(rank: int) -> None:
        transport = ThreadTransport(world, rank)
        comm = None
        try:  # (the communicator too: a rank that failed to make one must not return None)
            comm = Communicator(transport, timeout=timeout, check=check, name="local")
            results[rank] = fn(comm, *args)
            # A rank whose function returned has left, as an MPI rank whose program ended:
            # a peer still waiting for it in a later call hears so now, not at its timeout
            # (and calls it had in flight are lost with it).
            through = comm.calls.engine.finished_through()
            in_flight = " with calls in flight" if through < comm.calls.engine.seq else ""
            transport.tell_exit(through, f"it returned from its function{in_flight}, and "
                                "joins no later call")
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
            errors[rank] = exc
            through = comm.calls.engine.finished_through() if comm is not None else 0
            transport.tell_exit(through, f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
               for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        # Prefer the root cause over its echoes: "a peer failed", and "this communicator is
        # broken" (a rank that heard of the failure between two calls)
        primary = {r: e for r, e in errors.items()
                   if not isinstance(e, (PeerFailedError, CommunicatorBrokenError))} or errors
        raise primary[min(primary)]
    return results


def init(*, timeout: float = 300.0, check: bool = True) -> Communicator:
    """A communicator of one rank (this process): every collective returns its input's result."""
    return Communicator(ThreadTransport(ThreadWorld(1, timeout), 0), timeout=timeout,
                        check=check, name="local")
