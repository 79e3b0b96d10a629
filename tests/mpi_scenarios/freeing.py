"""What a freed communicator leaves behind, over real MPI ranks: nothing a communicator made
after it can receive (MPICH gives the new one the freed one's context).

* a status question a peer never read (a slow rank's wait asks; the peer it asks is through
  its call at once), asked outright, and asked by slow waits in rounds of dup, free and split;
* a message a user sent and no receive took;
* calls in flight at a free, one rank late (a needless dispute): the communicators are freed
  all the same, not kept; and so are those of calls refused at their agreement;
* every free finishes once every rank has freed (``draining.pending()``);
* communicators made and freed in a loop release their engines, the hang guard watching.
"""

from __future__ import annotations

import time

import numpy as np
from _common import WORLD, Report, meet
from collectives.backends import mpi
from collectives.backends.mpi import draining, transport
from mpi4py import MPI

from collectives import CollectiveError, Communicator, PeerFailedError

report = Report("freeing")
n, rank = WORLD.size, WORLD.rank
comm = mpi.init(timeout=60)


def stray_messages() -> list[str]:
    """Messages of freed communicators that communicators made now would hold."""

    made = [comm.transport.dup(), comm.transport.split(0, rank), comm.transport.dup()]
    found = [f"transport {i}'s {name}" for i, t in enumerate(made)
             for name, c in (("data", t.data.comm), ("control", t.control.comm),
                             ("notices", t.notices.comm), ("p2p", t.p2p.comm))
             if c.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)]
    for t in made:
        t.free()
    return found


def unread_question() -> None:
    """A question a peer never read stays with the communicator it was asked on: freed, its
    context goes to a new communicator (MPICH), which must not find it there."""


    old = Communicator(comm.transport.dup(), timeout=30)
    old.all_reduce(np.ones(1))
    notices = old.transport.notices
    if rank == 0:
        notices.ask_later()  # (asked by a slow wait; this one, nobody serves)
    else:
        deadline = time.monotonic() + 5
        while not notices.comm.Iprobe(0, MPI.ANY_TAG) and time.monotonic() < deadline:
            time.sleep(0.001)
    meet()
    old.free()
    stray = stray_messages()
    report.check(not stray, f"a question of a freed communicator reached {stray}")


def unreceived_message() -> None:
    """A message sent on a communicator and never received goes with its free: a new
    communicator's receive of that source and tag takes its own message (it took the old one,
    silently, where the shapes matched)."""
    old = Communicator(comm.transport.dup(), timeout=30)
    if rank == 0:
        old.send(np.full(4, 111.0), 1, tag=5)
    meet()
    old.free()
    new = Communicator(comm.transport.dup(), timeout=30)
    if rank == 0:
        new.send(np.full(4, 222.0), 1, tag=5)
    elif rank == 1:
        got = new.recv(np.zeros(4), 0, tag=5)
        report.check(np.array_equal(got, np.full(4, 222.0)), f"unreceived message: got {got}")
    new.free()
    stray = stray_messages()
    report.check(not stray, f"a message of a freed communicator reached {stray}")


def freed_after_disputes(rounds: int = 30) -> None:
    """Calls in flight at a free, one rank late: a slow wait may tell its peers it disputes a
    call (needlessly, as documented), and every call still succeeds. The communicators are
    freed all the same (a dispute's notice made the transport keep them, leaking five MPI
    communicators each time)."""


    before = transport.kept()
    for _ in range(rounds):
        c = Communicator(comm.transport.dup(), timeout=30)
        handles = [c.all_reduce(np.full(1000, 1.0), async_op=True, algorithm=a)
                   for a in ("native", "ring", "native")]
        if rank == 0:
            time.sleep(0.05)
        c.free()
        report.check(all(np.array_equal(h.wait(), np.full(1000, float(n))) for h in handles),
                     "freed after disputes: results")
    report.check(transport.kept() == before, f"{transport.kept() - before} transports kept")


def engines_released(rounds: int = 40) -> None:
    """Communicators made and freed in a loop, the hang guard watching (its period shortened):
    their engines are released. The guard's pass kept its list of engines, and the last one
    it looked at, through its sleep, and each pass's list the ones of the pass before: 28
    engines after 300 rounds of dup and free, and growing."""
    import gc

    from collectives.runtime import hang_guard
    from collectives.runtime.engine import Engine

    def alive() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is Engine)

    saved, hang_guard.PERIOD = hang_guard.PERIOD, 0.005
    try:
        time.sleep(saved + 0.05)  # (the guard's sleep under the old period ends first)
        before = alive()
        for _ in range(rounds):
            sub = comm.dup()
            sub.all_reduce(np.ones(64, np.float32))
            time.sleep(0.01)  # (a pass of the guard or two while it is watched)
            sub.free()
            del sub
        time.sleep(0.05)
        report.check(alive() <= before, f"{alive() - before} freed communicators' engines kept")
    finally:
        hang_guard.PERIOD = saved


def refused_calls(rounds: int = 20) -> None:
    """Calls refused at their agreement (a bad op on every rank, or on one) move nothing and
    leave the communicator usable: its free frees it (a rejection's notice made the transport
    keep five MPI communicators a time: MPICH ran out of contexts after about 340 rounds).
    But one refused after its peers had moved its data (the signature agreed before) breaks
    the communicator alike on every rank, telling no one: that one is kept."""
    before = transport.kept()
    for k in range(rounds):
        c = Communicator(comm.transport.dup(), timeout=30)
        try:
            c.all_reduce(np.ones(3), op="bogus" if k % 2 or rank == 0 else "sum")
        except (ValueError, PeerFailedError):
            pass
        report.check(c.all_reduce(np.ones(3))[0] == n, f"refused call {k}: not usable")
        c.free()
    report.check(transport.kept() == before, f"refused calls: {transport.kept() - before} kept")
    c = Communicator(comm.transport.dup(), timeout=30)
    c.all_reduce(np.ones(3))
    try:
        if rank == 0:
            meet()  # (the others have issued the agreed call, and moved its data, first)
            c.all_reduce(np.ones(3), op="bogus")
        else:
            handle = c.all_reduce(np.ones(3), async_op=True)
            meet()
            handle.wait()
    except (ValueError, CollectiveError):
        pass
    c.free()
    report.check(transport.kept() == before + 1, "a call refused after data moved: not kept")


def unread_notices(rounds: int = 6) -> None:
    """A rank that waits asks its peers what they do; a peer through its call at once never
    reads the question. Freed so, the question must not reach a communicator made after it
    (MPICH gives the new one the freed one's context): it read as the new one's agreement."""

    for k in range(rounds):
        old = Communicator(comm.transport.dup(), timeout=30)
        if rank != 0:
            time.sleep(0.05)  # rank 0 waits: it asks, and the others never serve it
        old.all_reduce(np.ones(4, np.float32))
        old.free()
        part = comm.transport.split(0, rank)
        assert part is not None
        new = Communicator(part, timeout=30)
        try:
            got = [new.all_gather_object(("x" * k, rank)) for _ in range(2)]
            report.check(got[1] == [("x" * k, r) for r in range(n)], f"unread notices {k}: {got}")
        except Exception as exc:  # noqa: BLE001 - what is checked is that nothing raises
            report.check(False, f"unread notices {k}: {type(exc).__name__}: {exc}")
        new.free()


def frees_finish(after: str, earlier: int) -> None:
    """Every rank freed: each free's counts and messages come, and it finishes. ``earlier``:
    frees of the scenarios before this one in its job that stay pending (after a failure, a
    peer that kept its transport posts no counts: the free keeps, as that peer does)."""
    meet()
    deadline = time.monotonic() + 10
    while len(draining.pending()) > earlier and time.monotonic() < deadline:
        draining.progress()
        time.sleep(0.01)
    report.check(len(draining.pending()) <= earlier,
                 f"{after}: frees never finished: {draining.pending()[earlier:]}")
    meet()


def main() -> None:
    meet()
    draining.progress()
    earlier = len(draining.pending())
    for scenario in (unread_question, unreceived_message, freed_after_disputes, refused_calls,
                     unread_notices, engines_released):
        frees_finish(f"before {scenario.__name__}", earlier)
        scenario()
    frees_finish("at the end", earlier)
    comm.free()
    report.finish()


if __name__ == "__main__":
    main()
