"""Calls whose signatures the ranks agreed before, where one rank now differs or comes late.

Once a signature is agreed, a call of it skips the agreement and moves its data at once. The
ranks must still find out when they disagree, or when a peer gave up on the call:

* one rank's asynchronous or prepared calls take a new signature while its peers repeat the
  agreed ones (the peers' activity shows only their latest call, so the rank that agrees must
  see them past the call it waits in): a mismatch on every rank within a second, not the
  communicator's timeout;
* two ranks each use a signature agreed before, but not the same one, and no message between
  them carries a check (MPI's shared-window path beside its messages: ``test_mpi``): their
  published checks differ, a mismatch within a second;
* a rank that comes after its peers timed out in an agreed call (MPI may have delivered their
  data already): an error, never a result its peers did not get;
* an all-to-all that times out after its signature was agreed: the timeout (thread ranks
  withdrew its sends as if they were receives, and raised ``AttributeError``);
* a thread rank's own code raising: its peers on a grandchild communicator hear of it, also
  where the communicator between was dropped.

And two signatures that only looked alike: a plain broadcast beside a prepared one (the
message says so), a compressed all-reduce beside a plain one of the wire's dtype (a mismatch,
where it paired and returned results of two dtypes).
"""

from __future__ import annotations

import gc
import time

import numpy as np

from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import last, timed_out

CASES: list[Case] = []
T = 0.5  # the timeout where a rank stays away
MISMATCH = raises("CollectiveMismatchError", within=1.5) | raises(
    "PeerFailedError", "CommunicatorBrokenError", match="CollectiveMismatchError", within=1.5)


def _signatures(ctx: Ctx, odd: bool) -> list[np.ndarray]:
    dtype = np.float64 if odd else np.float32
    return [np.full(6, ctx.rank + 1.0, dtype), np.full(5, ctx.rank + 1.0, dtype)]


def _async_pair(xs):
    def body(comm):
        return [h.wait() for h in [comm.all_reduce(x, async_op=True) for x in xs]]
    return body


def _prepared_pair(xs):
    def body(comm):
        calls = [comm.all_reduce_init(x, out=np.empty_like(x)) for x in xs]
        for call in calls:
            call.start()
        return [call.wait() for call in calls]
    return body


def _pair_agreed(make):
    def step(ctx: Ctx) -> Call:
        total = sum(range(1, ctx.size + 1))
        want = [np.full(6, total, np.float32), np.full(5, total, np.float32)]
        return Call(make(_signatures(ctx, False)), expect=ok(want))
    return step


def _pair_first_rank_odd(make):
    def step(ctx: Ctx) -> Call:
        return Call(make(_signatures(ctx, ctx.rank == 0)), expect=MISMATCH, same=False)
    return step


for kind, make in (("async", _async_pair), ("prepared", _prepared_pair)):
    CASES.append(Case(f"agreed-{kind}-pair-new-signature-on-rank-0",
                      (_pair_agreed(make), _pair_first_rank_odd(make)), sizes=(3,)))


def _late_after_agreed_timeout(ctx: Ctx) -> Call:
    x = np.full(4, float(ctx.rank + 1))
    if ctx.rank != ctx.size - 1:
        return Call("all_reduce", (x,), {"timeout": T},
                    expect=timed_out("all_reduce", T, naming=str(ctx.size - 1)), same=False)
    return Call("all_reduce", (x,), delay=T + 1.0, same=False,
                expect=raises("CollectiveTimeoutError", "PeerFailedError", within=1.0))


def _agreed_all_reduce(ctx: Ctx) -> Call:
    return Call("all_reduce", (np.full(4, float(ctx.rank + 1)),),
                expect=ok(np.full(4, float(sum(range(1, ctx.size + 1))))))


CASES.append(Case("late-rank-after-timeout-agreed", (_agreed_all_reduce, _late_after_agreed_timeout),
                  sizes=(2,)))


def _all_to_all_late(ctx: Ctx) -> Call:
    x = np.arange(ctx.size * 2, dtype=np.float64)
    if ctx.rank in last(ctx):
        return Call("all_to_all", (x,), delay=T + 0.5, same=False,
                    expect=raises("CollectiveTimeoutError", "PeerFailedError", within=1.0))
    return Call("all_to_all", (x,), {"timeout": T}, same=False,
                expect=timed_out("all_to_all", T))


CASES.append(Case("all-to-all-timeout-after-agreement", (
    lambda ctx: Call("all_to_all", (np.arange(ctx.size * 2, dtype=np.float64),), same=False),
    _all_to_all_late), sizes=(2,)))


def _grandchild_of_a_dropped_child(ctx: Ctx) -> Call:
    def body(comm):
        child = comm.dup().dup()  # (the communicator between is dropped at once)
        gc.collect()
        child.all_reduce(np.ones(3))
        if comm.rank == 1:
            raise RuntimeError("rank 1's own code fails")
        return child.all_reduce(np.ones(3))
    if ctx.rank == 1:
        return Call(body, expect=raises("RuntimeError"))
    # (the step's time holds two dups and a garbage collection, seconds on a loaded machine:
    # the bound tells a peer that heard from one that waited out the 30 s timeout; a peer
    # slow enough to hear rank 1's notice before its second call finds the grandchild broken,
    # naming rank 1's error)
    return Call(body, expect=raises("PeerFailedError", match="rank 1", within=10.0)
                | raises("CommunicatorBrokenError", match=r"rank 1\b.*RuntimeError", within=10.0),
                same=False)


CASES.append(Case("raising-rank-wakes-a-grandchild-communicator",
                  (_grandchild_of_a_dropped_child,), where=("threads",), timeout=30.0,
                  limit=45.0))


def _plain_and_prepared_broadcast(ctx: Ctx) -> Call:
    def body(comm):
        x = np.full(4, float(comm.rank + 1))
        prepared = comm.broadcast_init(x, root=0)  # (made on every rank: a step they all take)
        if comm.rank == 0:
            return comm.broadcast(x, root=0)
        return prepared.start().wait()
    return Call(body, expect=raises("CollectiveMismatchError", match="two forms", within=1.0),
                caught=True)


def _plain_beside_making_a_prepared_broadcast(ctx: Ctx) -> Call:
    def body(comm):
        x = np.full(4, float(comm.rank + 1))
        if comm.rank == 0:
            return comm.broadcast(x, root=0)
        return comm.broadcast_init(x, root=0).start().wait()
    return Call(body, expect=raises("CollectiveMismatchError", match="broadcast_init",
                                    within=1.0), caught=True)


CASES.append(Case("broadcast-plain-beside-prepared", (_plain_and_prepared_broadcast,),
                  sizes=(2,)))
CASES.append(Case("broadcast-plain-beside-making-a-prepared-one",
                  (_plain_beside_making_a_prepared_broadcast,), sizes=(2,)))


def _compressed_beside_wire_dtype(ctx: Ctx) -> Call:
    def body(comm):
        x = np.full(4, 0.25 * (comm.rank + 1), np.float32)
        if comm.rank == 0:
            return comm.all_reduce(x, compression="fp16")
        return comm.all_reduce(x.astype(np.float16))
    return Call(body, expect=raises("CollectiveMismatchError", match="compression",
                                    within=1.0), caught=True)


CASES.append(Case("compressed-beside-the-wire-dtype", (_compressed_beside_wire_dtype,),
                  sizes=(2,)))


def _two_in_flight(ctx: Ctx, first: dict) -> list:
    """Two asynchronous all-reduces, the first with ``first``'s arguments: a large one (MPI's
    own, under auto) and a small one behind it."""
    def body(comm):
        x = np.full(54_000, ctx.rank + 1.0, np.float32)
        y = np.full(7, ctx.rank + 1.0)
        handles = [comm.all_reduce(x, async_op=True, **first), comm.all_reduce(y, async_op=True)]
        return [h.wait() for h in handles]
    return body


def _agree_both(argument: str, values: tuple):
    def step(ctx: Ctx) -> Call:
        total = float(sum(range(1, ctx.size + 1)))

        def body(comm):
            got = [_two_in_flight(ctx, {argument: v})(comm) for v in values]
            return [r for pair in got for r in pair]
        return Call(body, expect=ok([np.full(54_000, total, np.float32), np.full(7, total)] * 2,
                                    rtol=1e-3 if argument == "compression" else 0.0))
    return step


def _last_rank_other(argument: str, values: tuple):
    def step(ctx: Ctx) -> Call:
        mine = values[1] if ctx.rank == ctx.size - 1 else values[0]
        return Call(_two_in_flight(ctx, {argument: mine}), expect=MISMATCH, same=False)
    return step


for argument, values in (("algorithm", ("auto", "ring")), ("compression", (None, "fp16"))):
    # Both signatures agreed before; the last rank's first call takes the other, with a
    # second call in flight behind it. (MPI: the peers' own all-reduce waited for the last
    # rank's, which ran the ring; each rank saw only its peers' latest call, and every rank
    # waited out its timeout. A stalled MPI call now asks its peers for their call of its
    # number, however they run it.)
    CASES.append(Case(f"agreed-{argument}-differs-with-a-call-behind",
                      (_agree_both(argument, values), _last_rank_other(argument, values)),
                      sizes=(2, 3)))


def _rooted(kind: str, root_of):
    """A call of ``kind`` with ``root_of(comm)`` as its root, then a barrier: ranks whose part
    of a rooted call ends early hear of a mismatch at their next call."""
    def body(comm):
        x, root = np.full(4, comm.rank + 1.0), root_of(comm)
        if kind == "gather":
            got = comm.gather(x, root=root)
        elif kind == "reduce-init":
            call = comm.reduce_init(x, out=np.empty_like(x), root=root, algorithm="tree")
            call.start()
            got = call.wait()
            call.free()
        else:
            got = comm.reduce(x, root=root, algorithm="tree")
        comm.barrier()
        return got
    return body


def _both_roots(kind: str):
    def step(ctx: Ctx) -> Call:
        def body(comm):
            return [_rooted(kind, lambda c, r=root: r)(comm) for root in (0, 1, 0, 1)]
        return Call(body, same=False, expect=ok())
    return step


def _last_rank_other_root(kind: str):
    def step(ctx: Ctx) -> Call:
        return Call(_rooted(kind, lambda c: 1 if c.rank == c.size - 1 else 0), expect=MISMATCH,
                    same=False)
    return step


for kind in ("reduce", "reduce-init", "gather"):
    # Both roots agreed before; the last rank now takes the other. (The root waited out its
    # timeout for a part that never came, and blamed a rank that arrived: the peer whose
    # part it waited for had finished the call, under its own root; a rank finished that
    # way is seen now, twice 0.2 s apart, and the call fails as a mismatch.)
    CASES.append(Case(f"agreed-root-differs-{kind}", (_both_roots(kind),
                                                      _last_rank_other_root(kind)), sizes=(3,)))


def _late_rank_while_a_peer_waits_for_a_message(ctx: Ctx) -> Call:
    """An agreed gather to root 1, rank 0 1 s late (within the timeout); rank 1 then sends
    rank 2 a message, which rank 2, done with the gather at once, waits for. Every rank's
    calls are right. (Rank 2's slow receive carries the gather's number: it asked its peers
    what they do, took rank 1's gather for a dispute, and every rank failed at its timeout,
    the communicator broken.)"""
    x = np.full(8, float(ctx.rank + 1))

    def body(comm):
        for _ in range(2):
            comm.gather(x, root=1)
        comm.barrier()
        if ctx.rank == 0:
            time.sleep(1.0)
        got = comm.gather(x, root=1)
        if ctx.rank == 1:
            comm.send(np.ones(4), 2)
        elif ctx.rank == 2:
            comm.recv(np.empty(4), 1)
        return None if got is None else got.tolist()
    return Call(body, same=False, expect=ok(within=2.5))


CASES.append(Case("agreed-gather-late-rank-while-a-peer-waits-for-a-message",
                  (_late_rank_while_a_peer_waits_for_a_message,), sizes=(3,), timeout=6.0,
                  limit=30.0))
