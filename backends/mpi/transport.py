"""The MPI transport: everything a ``Communicator`` needs, over mpi4py.

It duplicates the user's communicator four times: ``data`` (the schedules' messages and
every native collective), ``control`` (argument agreements), ``notices`` (failure notices
and status questions) and ``p2p`` (the communicator's own ``send``/``recv``), so none of
their messages ever matches another's, or the user's.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from collectives.arrays import NUMPY
from collectives.runtime.departures import exit_notice
from collectives.runtime.transport import Failure, engine_of, ignore_verdict

from . import draining, leftovers, tuning, waiting
from .channel import MPIChannel
from .freeing import agree_to_free
from .groups import groups_from_env, layout_for, local_place, shared_nodes
from .messages import MessageChannel
from .native_collectives import MPINatives
from .notices import Notices
from .shm_window import SharedWindow
from .tags import SEQ_BITS, control_tags, data_tags, user_tags
from .waiting import node_oversubscribed

_KEPT: list = leftovers.keep([])  # failed transports' communicators, never freed (MPITransport.free)
_LIVE: weakref.WeakSet = weakref.WeakSet()  # transports a rank's exit tells its peers about


def kept() -> int:
    """How many transports were kept instead of freed, after failures (a test's question)."""
    return len(_KEPT)


def say_goodbye(why: str = "it exited (status 0)") -> None:
    """At a rank's exit: every live transport tells its peers after which call it left."""
    for transport in list(_LIVE):
        try:
            transport.say_goodbye(why)
        except Exception:  # noqa: BLE001, S112 - exiting: one broken transport must not stop the rest
            continue

SERVE_AFTER = 1e-3  # a wait this long answers peers' questions...
SERVE_EVERY = 1e-3  # ...at most this often
ASK_SECONDS = 0.25  # how long a timed-out call waits for its peers' answers, at most


def check_thread_level() -> None:
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            "collectives' MPI transport needs MPI_THREAD_MULTIPLE (asynchronous calls progress "
            "on a thread of their own), but MPI was initialised with a lower thread level; "
            "mpi4py asks for it by default: do not lower mpi4py.rc.thread_level")


# Notices that leave no message in flight by themselves: a dispute (a late agreement that finds
# a mismatch where data moved breaks the communicator, which ``free`` reads; one that finds
# none moves nothing) and a rejection (a call refused at its agreement moved nothing; a peer
# that had moved its data joins late and breaks alike). Their notices, read or not, go with
# the drain at free.
HARMLESS = ("disputed", "rejected")


class MPITransport:
    """One rank's transport over an mpi4py communicator (collective to create and free)."""

    name = "mpi"
    arrays = NUMPY
    cost_model = tuning.COST_MODEL
    # over libfabric, MPICH's MPI_Test or MPI_Improbe may never return once a peer died: the
    # hang guard (collectives.runtime.hang_guard) ends such a rank instead of letting it hang
    calls_may_not_return = True
    # the other optional hooks (``collectives.runtime.transport``), as their defaults
    schedules_in_native_order = False
    # a schedule's messages carry the low SEQ_BITS of their call's number (``.tags``): two
    # calls that many apart in flight at once would take each other's messages
    calls_apart = 1 << SEQ_BITS
    processes = True
    fabric = link = None

    def __init__(self, comm: Any, *, groups: Any = "node", oversubscribed: bool | None = None,
                 nodes: tuple[tuple[int, ...], ...] | None = None):
        check_thread_level()
        draining.progress()  # (earlier frees whose peers have freed since)
        _LIVE.add(self)
        self.engine: Any = None  # (a weak reference to the engine, set by it)
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self._groups = groups
        layout_for(groups, ((r,) for r in range(self.size)), self.size)  # bad groups: raise now
        self._comms = [comm.Dup() for _ in range(4)]
        data, control, notices, p2p = self._comms
        self._node = data.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        hosts = shared_nodes(data, self._node)  # real ones, even where simulated nodes are set
        # (a sub-communicator's: its parent's nodes, simulated ones too, among its ranks)
        nodes = nodes or groups_from_env(self.size) or hosts
        self.nodes = nodes
        self.local_rank, self.local_size = local_place(nodes, self.rank)
        self.layout = layout_for(groups, nodes, self.size)
        ub = data.Get_attr(MPI.TAG_UB)
        self.data = MPIChannel(data, data_tags(ub), "data", probe=True)
        self.control = MPIChannel(control, control_tags(ub), "control", probe=False)
        self.p2p = MessageChannel(p2p, user_tags(ub))
        self.notices = Notices(notices, near=next(g for g in hosts if self.rank in g))
        self.native = MPINatives(data, self.control, SharedWindow(self._node, self.size),
                                 self.notices)
        self.notices.calls = self.native.inflight
        self.notices.other_call = self._call_in_flight
        self.notices.checks_in_flight = self._checks_in_flight
        self.shared_memory = self.native.shm.shared  # (Communicator.shared_empty)
        # (a new communicator's ranks share their cores with the rest of the job: its
        # parent's finding holds for it)
        self.oversubscribed = (node_oversubscribed(self._node) if oversubscribed is None
                               else oversubscribed)
        if self.oversubscribed:  # more ranks than cores here: the hot path does not spin either
            self.native.spin = 0.0
        self._served = 0.0
        self._troubled = False  # a failure may have left messages in flight
        self.left = False  # this rank told its peers it left (it frees nothing: freeing.py)
        self.gone: set[int] = set()  # the peers that told this rank they left

    def __repr__(self) -> str:
        return f"<MPITransport rank {self.rank} of {self.size}, {len(self.nodes)} node(s)>"

    # --- waiting and failures -----------------------------------------------------------

    def idle(self, waited: float) -> None:
        waiting.idle(waited)
        if waited > SERVE_AFTER:
            now = time.monotonic()
            if now - self._served > SERVE_EVERY:
                self._served = now
                self.notices.serve()

    def say_goodbye(self, why: str = "it exited (status 0)") -> None:
        """Tell every peer that this rank leaves after its latest call (a notice of kind
        "exited"), and ``why``: peers waiting in a later call fail at once, naming it."""
        if not self._comms or self.notices.comm is None:
            return  # (freed)
        activity = self.notices.activity
        # (the hot path publishes no activity: its bound calls know their latest number)
        seq = max(activity[0] if activity else 0, self.native.latest_seq())
        engine = engine_of(self)
        if engine is not None:  # (calls still in flight here are lost: peers must not wait)
            seq = min(seq, engine.finished_through())
        self.notify_failure(exit_notice(self, seq, f"{why} with every call through {seq} "
                                        "finished, and joins no later call"))

    def notify_failure(self, failure: Failure) -> None:
        self._troubled = self._troubled or failure.kind not in HARMLESS
        self.left = self.left or failure.kind == "exited"
        self.notices.notify(failure)

    def poll_failure(self) -> Failure | None:
        failure = self.notices.poll()
        if failure is not None:
            self._troubled = self._troubled or failure.kind not in HARMLESS
            if failure.kind == "exited":
                self.gone.add(failure.rank)
        return failure

    def agreement_waiting(self, seq: int) -> bool:
        control = self.control
        return bool(control.comm.Iprobe(MPI.ANY_SOURCE, control.tags.tag(seq, 0)))

    def _call_in_flight(self, seq: int) -> tuple | None:
        """(check, description) of this rank's call ``seq`` while it is in flight (not a
        native one: ``notices.calls`` has those), for a peer whose native call ``seq`` has
        stalled (``MPINatives.stalled``): a check of another call tells it they disagree."""
        engine = engine_of(self)
        return engine.call_in_flight(seq) if engine is not None else None

    def _checks_in_flight(self) -> dict[int, int] | None:
        engine = engine_of(self)
        return engine.checks_in_flight() if engine is not None else None

    def publish_activity(self, activity: tuple) -> None:
        self.notices.activity = activity

    def verdict_pending(self, seq: int) -> Callable[[bool], None]:
        """Nothing compared on the side: a call's data carries its check value."""
        return ignore_verdict

    def issue_messages(self) -> None:
        """Nothing held: MPI posts a message as it is sent."""

    def reading_inputs(self, seq: int) -> None:
        """Nothing to order: MPI reads host memory when the call posts it."""

    def peer_activity(self, timeout: float) -> dict[int, tuple]:
        return self.notices.ask(min(timeout, ASK_SECONDS))

    # --- communicators ------------------------------------------------------------------

    def dup(self) -> MPITransport:
        """A new transport over the same ranks (collective)."""
        return MPITransport(self._comms[0], groups=self._groups,
                            oversubscribed=self.oversubscribed, nodes=self.nodes)

    def split(self, color: int | None, key: int) -> MPITransport | None:
        """``MPI_Comm_split``'s meaning (collective); None where ``color`` is None. The new
        transport's node groups are this one's, among its own ranks (simulated nodes too:
        ``COLLECTIVES_RANKS_PER_NODE`` counts this communicator's ranks, not the new one's)."""
        comm = self._comms[0].Split(MPI.UNDEFINED if color is None else color, key)
        if comm == MPI.COMM_NULL:
            return None
        try:  # a partition of the old ranks means nothing among the new ones
            groups = "node" if isinstance(self._groups, (list, tuple)) else self._groups
            node_of = {r: i for i, group in enumerate(self.nodes) for r in group}
            mine = comm.allgather(node_of[self.rank])  # (each new rank's node, in new order)
            nodes = tuple(tuple(r for r, n in enumerate(mine) if n == node)
                          for node in dict.fromkeys(mine))
            return MPITransport(comm, groups=groups, oversubscribed=self.oversubscribed,
                                nodes=nodes)
        finally:
            comm.Free()

    def abort(self, code: int = 1) -> None:
        """End the whole job now (``MPI_Abort``): after a failure, ``MPI_Finalize`` at exit
        may wait forever for a dead or hung peer."""
        self._comms[0].Abort(code)

    def free(self) -> None:
        """Release the duplicated communicators and what lives on them (collective), once the
        notices and point-to-point messages nobody read have come (``draining``: MPI could
        deliver them to a new communicator that reused a freed one's context).

        After a failure they are kept instead: messages of the failed call (a collective MPI
        cannot cancel) may still arrive."""
        if not self._comms:
            return
        engine = engine_of(self)  # (broken where every rank broke alike, telling no one)
        troubled = bool(self._troubled or self.native.abandoned or any(
            c.withdrew for c in (self.data, self.control, self.p2p)) or (
            engine is not None and engine.broken_by_failure()))
        shm = self.native.shm
        if shm is not None and shm.win is not None and self.size > 1:
            # (its free waits for every rank: they decide together, unless this one left)
            troubled = self.left or not agree_to_free(self, troubled)
        if troubled:
            _KEPT.append((self._node, *self._comms, self.native, self.notices))
        else:  # (once the notices nobody read are received: draining)
            self.native.free()
            sent, received, sends = self.notices.free()
            p2p = self.p2p
            draining.free_when_drained([(self._comms[2], sent, received),
                                        (p2p.comm, p2p.sent, p2p.received)],
                                       (self._node, *self._comms), sends)
        for channel in (self.data, self.control, self.p2p):
            channel.free()
        self._comms = []
