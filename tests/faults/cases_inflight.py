"""SPMD fault cases about many calls in flight, point-to-point types, freed communicators and
call numbers: what a program with hundreds of asynchronous calls, or several shared-memory
all-reduces, in flight must still get right, and what it is told when something goes wrong.

Each entry is a ``Case`` (see ``faults.kit``); ``faults.table`` gathers them. The bodies
(``Call`` with a function of the communicator) do several calls each and return what they
saw, which the step's ``check`` judges.
"""

from __future__ import annotations

import time

import numpy as np

from faults.kit import Call, Case, Ctx, ok, raises
from faults.steps import bucket_step, timed_out

CASES: list[Case] = []
BOTH = ("threads", "mpi")


def add(name: str, *steps, **meta) -> None:
    CASES.append(Case(name, steps, **meta))


def nothing_wrong(summary: dict) -> str | None:
    """A body's summary: wrong results and errors it saw, each a list (empty when right)."""
    if summary["wrong"] or summary["errors"]:
        return (f"{len(summary['wrong'])} wrong results (first {summary['wrong'][:2]}), errors "
                f"{summary['errors'][:3]} ({len(summary['errors'])} in all)")
    return None


# --- shared-memory all-reduces in flight ----------------------------------------------------------

def shm_in_flight(ctx: Ctx) -> Call:
    """Rounds of three asynchronous ``shm`` all-reduces in flight, rank 1 slow to wait for
    them; the payload grows now and then, so the window grows with runs in flight (the first
    round creates it). Every sum must be right: a run reusing a buffer a slow peer still
    copies out of gives a peer's raw input instead."""
    def body(comm):
        summary: dict = {"wrong": [], "errors": []}
        n = comm.size
        for rnd in range(12):
            count = 1000 + 700 * (rnd // 3)
            xs = [np.full(count, float(comm.rank + 1 + 10 * k + rnd)) for k in range(3)]
            try:
                handles = [comm.all_reduce(x, "sum", "shm", async_op=True) for x in xs]
                if comm.rank == 1:
                    time.sleep(0.005)
                for k, h in enumerate(handles):
                    got = h.wait()
                    want = sum(float(p + 1 + 10 * k + rnd) for p in range(n))
                    if not np.all(got == want):
                        summary["wrong"].append(f"round {rnd} call {k}: {got[:2]}... != {want}")
            except Exception as exc:  # noqa: BLE001 - reported in the summary
                summary["errors"].append(f"round {rnd}: {type(exc).__name__}: {exc}"[:300])
                break
        return summary

    return Call(body, expect=ok(check=nothing_wrong), same=False)


add("shm-three-in-flight", shm_in_flight, where=("mpi",), sizes=(2, 3), timeout=5.0,
    limit=20.0)

# --- hundreds of asynchronous calls in flight -----------------------------------------------------


def many_in_flight(count: int):
    """``count`` asynchronous all-reduces issued at once, then waited for in order: each sum
    right, no error (and no hang: the case's limit)."""
    def step(ctx: Ctx) -> Call:
        def body(comm):
            n = comm.size
            summary: dict = {"wrong": [], "errors": []}
            handles = [comm.all_reduce(np.full(6, float(i + comm.rank)), async_op=True)
                       for i in range(count)]
            for i, h in enumerate(handles):
                try:
                    got = h.wait()
                except Exception as exc:  # noqa: BLE001 - reported in the summary
                    summary["errors"].append(f"call {i}: {type(exc).__name__}: {exc}"[:300])
                    continue
                if not np.all(got == n * i + n * (n - 1) / 2):
                    summary["wrong"].append(f"call {i}: {got}")
            return summary

        return Call(body, expect=ok(check=nothing_wrong), same=False)

    return step


add("many-in-flight-200", many_in_flight(200), where=BOTH, timeout=20.0, limit=40.0)
add("many-in-flight-1000", many_in_flight(1000), where=(*BOTH, "mpi-nodes"), sizes=(3, 4),
    timeout=20.0, limit=40.0)


def over_the_limit(ctx: Ctx) -> Call:
    """More asynchronous all-reduces than may be outstanding (``MAX_IN_FLIGHT``): every rank
    refuses the same call, its handle's ``wait()`` raising a CollectiveError on every rank
    (refused in its agreement: no data moves); the earlier ones all give right sums; after
    some ``wait()``s a retry runs once; the communicator stays usable. Rank 1 waits for
    nothing before the limit is reached and is slow to wait: what counts is handles not
    waited on, not calls still running."""
    def body(comm):
        from collectives.runtime import in_flight

        n, limit = comm.size, in_flight.MAX_IN_FLIGHT
        summary: dict = {"wrong": [], "errors": []}
        handles = [comm.all_reduce(np.full(3, float(i)), async_op=True) for i in range(limit)]
        try:
            comm.all_reduce(np.full(3, -1.0), async_op=True).wait()
            summary["errors"].append(f"call {limit + 1} ran past the limit")
        except Exception as exc:  # noqa: BLE001 - judged below
            if "wait() for some first" not in str(exc):
                summary["errors"].append(f"refused with {type(exc).__name__}: {exc}")
        if comm.rank == 1:
            time.sleep(0.2)
        for i, h in enumerate(handles[:5]):
            if not np.all(h.wait() == n * i):
                summary["wrong"].append(f"call {i}")
        retry = comm.all_reduce(np.full(3, 7.0), async_op=True)  # (room again: it runs once)
        del handles[:5]
        for i, h in enumerate(handles, 5):
            if not np.all(h.wait() == n * i):
                summary["wrong"].append(f"call {i}")
        if not np.all(retry.wait() == 7.0 * n):
            summary["wrong"].append("the retry")
        if not np.all(comm.all_reduce(np.ones(2)) == n):
            summary["wrong"].append("a blocking call afterwards")
        return summary

    return Call(body, expect=ok(check=nothing_wrong), same=False)


add("over-the-in-flight-limit", over_the_limit, where=BOTH, timeout=20.0, limit=40.0)


def one_rank_over_the_limit(kind: str):
    """Rank 0 keeps ``MAX_IN_FLIGHT`` handles unwaited, its peers wait for each: only rank
    0 is over the limit at the next asynchronous call (a new signature; or a batch of three
    buckets, refused once for each). Rank 0 raises a CollectiveError saying so, its peers a
    PeerFailedError naming it, within a second; the ranks stay in step (once, the refusal
    stayed on rank 0: its peers' call paired with its next one, a mismatch there and a
    timeout here)."""
    def step(ctx: Ctx) -> Call:
        def body(comm):
            from collectives.runtime.in_flight import MAX_IN_FLIGHT

            x, kept = np.ones(4), []
            for _ in range(MAX_IN_FLIGHT):
                handle = comm.all_reduce(x, async_op=True)
                if comm.rank == 0:
                    kept.append(handle)
                else:
                    handle.wait()
            start = time.monotonic()
            try:
                # (buckets of three shapes, each agreed on its own: where two were alike,
                # peers would move the second's data as agreed, and break on the refusal)
                xs = [np.ones(3), np.ones(6), np.ones(7)]
                if kind == "batch":
                    comm.batch_all_reduce(xs, bucket_bytes=0, async_op=True).wait()
                elif kind == "buckets":
                    bucket_step(comm, xs, bucket_bytes=0)
                else:
                    comm.all_reduce(np.ones(5), async_op=True).wait()
                outcome = "ran"
            except Exception as exc:  # noqa: BLE001 - judged below
                outcome = type(exc).__name__ if "wait() for some first" in str(exc) else str(exc)
            late = time.monotonic() - start > 1.0 and comm.rank != 0  # (rank 0 waits for its
            for handle in kept:                                        # peers' 1024 waits)
                handle.wait()
            after = float(comm.all_reduce(np.ones(2))[0])
            return [outcome, late, after]
        want = ["CollectiveError" if ctx.rank == 0 else "PeerFailedError", False, float(ctx.size)]
        return Call(body, expect=ok(check=lambda got: None if got == want else
                                    f"got {got}, want {want}"), same=False)
    return step


for kind in ("plain", "batch", "buckets"):
    # (two ranks hold the whole case, one over the limit and one with room: each item issues
    # 1024 calls, and a third rank added seconds to a suite near its time limit)
    add(f"one-rank-over-the-in-flight-limit-{kind}", one_rank_over_the_limit(kind), where=BOTH,
        sizes=(2,), timeout=20.0, limit=40.0)


T_STOP = 1.0


def rank_stops_with_calls_in_flight(ctx: Ctx) -> Call:
    """The last rank makes 10 of the 20 asynchronous calls, then stops (it is busy elsewhere);
    the others time out naming it, not each other (alive, with calls in flight)."""
    last = ctx.size - 1

    def body(comm):
        calls = 10 if comm.rank == last else 20
        handles = [comm.all_reduce(np.ones(6), async_op=True) for _ in range(calls)]
        for h in handles:
            h.wait()

    if ctx.rank == last:
        return Call(body, same=False)
    return Call(body, expect=timed_out("all_reduce", T_STOP, naming=str(last)), same=False)


add("rank-stops-with-calls-in-flight", rank_stops_with_calls_in_flight,
    where=(*BOTH, "mpi-nodes"), sizes=(3, 4),
    timeout=T_STOP, limit=15.0)

# --- point-to-point messages of another type ------------------------------------------------------


def p2p(send: np.ndarray, into: np.ndarray, expect_recv, tag: int):
    """Rank 0 sends ``send`` to rank 1, which receives into ``into``; other ranks stay away."""
    def step(ctx: Ctx) -> Call | None:
        if ctx.rank == 0:
            return Call("send", (send, 1), {"tag": tag}, ok(None), same=False)
        if ctx.rank == 1:
            return Call("recv", (), {"out": into.copy(), "src": 0, "tag": tag}, expect_recv,
                        caught=True, same=False)
        return None
    return step


def _type_mismatch(name: str, send: np.ndarray, into: np.ndarray, said: str) -> None:
    """A receive into an array of another dtype or length raises CollectiveMismatchError
    naming both; the next message on the same tag still pairs with the next receive."""
    after = np.arange(3, dtype=np.float64) + 7
    add(f"p2p-{name}", p2p(send, into, raises("CollectiveMismatchError", match=said, within=1.0),
                           tag=3),
        p2p(after, np.zeros(3), ok(after), tag=3), where=BOTH, sizes=(2, 3), timeout=2.0)


_type_mismatch("float32-into-int32", np.arange(4, dtype=np.float32), np.zeros(4, np.int32),
               r"4 elements of float32 where 4 of int32")
_type_mismatch("large-float32-into-int32", np.arange(100_000, dtype=np.float32),
               np.zeros(100_000, np.int32), r"100000 elements of float32 where 100000 of int32")
_type_mismatch("float64-into-int32", np.arange(4, dtype=np.float64), np.zeros(4, np.int32),
               r"float64.* int32")
# a message in one piece against a receive expecting several, and the other way round
_type_mismatch("small-into-large", np.arange(4, dtype=np.float64), np.zeros(100_000),
               r"4 elements of float64 where 100000 of float64")
_type_mismatch("large-into-small", np.arange(100_000, dtype=np.float64), np.zeros(4),
               r"100000 elements of float64 where 4 of float64")

# --- a freed communicator, and the numbers calls are given ----------------------------------------


def call_on_freed(ctx: Ctx) -> Call:
    """A collective on a communicator that was freed: a clear error of the library's."""
    def body(comm):
        child = comm.dup()
        child.free()
        return child.all_reduce(np.ones(4))

    return Call(body, expect=raises("CommunicatorBrokenError", match="freed", within=0.5),
                caught=True, same=False)


add("call-on-freed-communicator", call_on_freed, where=BOTH, sizes=(2, 3))


T_NUMBER = 0.5


def third_call_is_call_3(ctx: Ctx) -> Call:
    """A program's third all-reduce is "call 3" in the error that names it, under MPI too,
    where ``collectives.init()`` checks every rank's library version first."""
    last = ctx.size - 1

    def body(comm):
        if ctx.transport.startswith("mpi"):
            import collectives
            from collectives.api import initialize

            initialize._ACTIVE.pop("mpi", None)  # a fresh init, as a program's first
            comm = collectives.init("mpi", timeout=T_NUMBER)
        for _ in range(3 if comm.rank != last else 2):
            comm.all_reduce(np.ones(4))

    if ctx.rank == last:
        return Call(body, same=False)
    third = r"all_reduce\([^)]*\) \(call 3\) timed out"
    return Call(body, expect=raises("CollectiveTimeoutError", match=third, within=T_NUMBER + 1.0)
                | raises("PeerFailedError", match=third), same=False)


add("third-call-is-call-3", third_call_is_call_3, where=BOTH, sizes=(2,), timeout=T_NUMBER)


def freed_in_flight(ctx: Ctx) -> Call:
    """A child communicator freed with calls in flight (every rank): the collectives finish
    first, their handles' ``wait()`` giving the right sums (an all-reduce large enough to
    take MPI's shared memory too), a receive nothing sends is withdrawn with a
    CommunicatorBrokenError saying so; the parent works on. (MPI raised its own error
    about a null communicator at the wait, or failed in a shared window's free.)"""
    def body(comm):
        child = comm.dup()
        child.all_reduce(np.ones(8))  # (agreed: the calls below move data at once)
        if comm.rank == 1:
            time.sleep(0.3)  # (the others free while its calls are still running)
        small = child.all_reduce(np.ones(8), async_op=True)
        large = child.all_reduce(np.ones(1 << 18), async_op=True)
        never = child.irecv(np.zeros(2), (comm.rank + 1) % comm.size, tag=5)
        child.free()
        got = [float(small.wait()[0]), float(large.wait()[-1])]
        try:
            never.wait()
            got.append("received")
        except Exception as exc:  # noqa: BLE001 - judged below
            got.append(type(exc).__name__ if "freed" in str(exc) else str(exc))
        got.append(float(comm.all_reduce(np.ones(2))[0]))
        return got

    n = float(ctx.size)
    want = [n, n, "CommunicatorBrokenError", n]
    return Call(body, expect=ok(check=lambda got: None if got == want else
                                f"got {got}, want {want}"), same=False)


add("freed-with-calls-in-flight", freed_in_flight, where=BOTH, sizes=(2, 3), timeout=10.0,
    limit=30.0)


def error_in_a_with_block(raiser: int, again: bool):
    """Rank ``raiser``'s code raises inside ``with comm.dup() as child:`` after a call there
    (on MPI through the shared window, whose free waits for every rank), and catches it
    outside; its block's end does not free collectively. With ``again`` its peers make a
    second call there, which it will not: they hear that it left, naming its error, well
    within their timeout (on MPI the raising rank waited in the window's free for the peers'
    timeout, so an uncaught error took that long to end the job). Without, their blocks end as written
    and free the child, without waiting in the window's free for the rank that left (they
    waited there forever). Everyone's parent works on."""
    def step(ctx: Ctx) -> Call:
        algorithm = "shm" if ctx.transport == "mpi" else "auto"

        def body(comm):
            start, outcome = time.monotonic(), "left"
            try:
                with comm.dup() as child:
                    child.all_reduce(np.ones(1 << 18), algorithm=algorithm)
                    if comm.rank == raiser:
                        raise RuntimeError("boom in the block")
                    if again:
                        child.all_reduce(np.ones(1 << 18), algorithm=algorithm)
            except Exception as exc:  # noqa: BLE001 - judged below
                outcome = ("raised its own" if type(exc) is RuntimeError else type(exc).__name__
                           if "boom in the block" in str(exc) else str(exc))
            quick = time.monotonic() - start < 5.0  # (half the case's timeout: not waited out)
            return [outcome, quick, float(comm.all_reduce(np.ones(2))[0])]

        # (a peer that hears of it before its second call: CommunicatorBrokenError, naming it)
        heard = (("raised its own",) if ctx.rank == raiser else
                 ("PeerFailedError", "CommunicatorBrokenError") if again else ("left",))

        def check(got) -> str | None:
            right = got[0] in heard and got[1:] == [True, float(ctx.size)]
            return None if right else f"got {got}, want one of {heard}, True, {float(ctx.size)}"
        return Call(body, expect=ok(check=check), same=False)
    return step


add("error-leaves-a-with-block", error_in_a_with_block(1, again=True), where=BOTH,
    sizes=(2, 3), timeout=10.0, limit=30.0)
add("error-leaves-a-with-block-peers-free", error_in_a_with_block(0, again=False), where=BOTH,
    sizes=(2, 3), timeout=10.0, limit=30.0)


def freed_late_on_one_rank(ctx: Ctx) -> Call:
    """A child whose all-reduces took MPI's shared window (its free waits for every rank),
    freed by rank 0 at once and by the others half a second later: rank 0 waits for them, as
    MPI's window free does, and every free returns once all have come (the ranks agree
    before the window's free: none gives up and keeps while another frees, which would leave
    that one in the window's free forever)."""
    algorithm = "shm" if ctx.transport == "mpi" else "auto"  # (a window: MPI's alone)

    def body(comm):
        child = comm.dup()
        child.all_reduce(np.ones(1 << 18), algorithm=algorithm)
        if comm.rank != 0:
            time.sleep(0.5)  # (no call meanwhile: nothing here hears rank 0 before its free)
        start = time.monotonic()
        child.free()
        took = time.monotonic() - start
        return [took < 2.0, float(comm.all_reduce(np.ones(2))[0])]

    want = [True, float(ctx.size)]
    return Call(body, expect=ok(check=lambda got: None if got == want else
                                f"got {got}, want {want}"), same=False)


add("freed-late-on-one-rank", freed_late_on_one_rank, where=BOTH, sizes=(2, 3), timeout=2.0,
    limit=30.0)
