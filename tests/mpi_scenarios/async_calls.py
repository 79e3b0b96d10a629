"""Asynchronous and prepared calls over real MPI ranks, and new communicators.

* many calls in flight (every collective, natives and schedules, small and large), waited in
  an order that differs from rank to rank, mixed with blocking calls;
* back-to-back small all-reduces (the hot path), every result checked, past two wraps of
  the calls' sequence numbers; and asynchronous calls whose handles were dropped, more in
  flight than a wrap, with one rank behind;
* prepared calls of every collective, started again and again on refilled inputs, and not
  started again while another thread's ``wait()`` for the last run has not returned;
* a collective called from a done-callback: refused there, the hot path's too;
* ``dup`` and ``split`` of the transport, each a communicator of its own (``freeing.py``:
  what a freed one leaves behind);
* point-to-point messages (``send``/``recv``, ``isend``/``irecv``) between collectives, and a
  receive that times out, after which the communicator still works;
* the suite's batch bodies (``tests/suite/bodies.py``, ``kept_bodies.py``): fused batches,
  blocking and async, buckets started as their tensors become ready, and buckets kept from
  call to call, every rank's bits compared.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from _common import WORLD, Report, meet
from collectives.backends import mpi
from collectives.backends.mpi import tags

from collectives import CollectiveError, Communicator

report = Report("async")
n, rank = WORLD.size, WORLD.rank
comm = mpi.init(timeout=60)


def value(k: int, count: int, r: int) -> np.ndarray:
    return (np.arange(count) % 5 + k + r).astype(np.float64)


def total(k: int, count: int) -> np.ndarray:
    return sum(value(k, count, r) for r in range(n))


# (A broadcast learns what it receives before its data stage exists, so a native broadcast
# would take its place among the natives late: in flight with others, it runs a schedule.)
CALLS = [("all_reduce", "native", 10), ("all_reduce", "ring", 1000), ("all_reduce", "auto", 1 << 17),
         ("reduce", "native", 100), ("broadcast", "tree", 50), ("all_gather", "native", 7),
         ("reduce_scatter", "rechd", 12), ("all_reduce", "tree", 3)]


def issue(k: int, method: str, algorithm: str, count: int, async_op: bool):
    x = value(k, count, rank)
    if method == "all_reduce":
        got = comm.all_reduce(x, "sum", algorithm, async_op=async_op)
        want = total(k, count)
    elif method == "reduce":
        got = comm.reduce(x, "sum", n - 1, algorithm, async_op=async_op)
        want = total(k, count) if rank == n - 1 else None
    elif method == "broadcast":
        got = comm.broadcast(x, 0, algorithm, out=np.empty_like(x), async_op=async_op)
        want = value(k, count, 0)
    elif method == "all_gather":
        got = comm.all_gather(x, 0, algorithm, async_op=async_op)
        want = np.concatenate([value(k, count, r) for r in range(n)])
    else:
        got = comm.reduce_scatter(x, "sum", algorithm, async_op=async_op)
        want = total(k, count)[rank * count // n:(rank + 1) * count // n]
    return got, want


def same(got, want) -> bool:
    return (got is None and want is None) or (got is not None and np.array_equal(got, want))


def many_in_flight() -> None:
    for method, algorithm, count in CALLS:  # each signature agreed once, by a blocking call
        got, want = issue(0, method, algorithm, count, False)
        report.check(same(got, want), f"first {method} {algorithm}")
    pending = []
    for k in range(1, 41):
        method, algorithm, count = CALLS[k % len(CALLS)]
        work, want = issue(k, method, algorithm, count, True)
        pending.append((k, work, want))
        if k % 10 == 0:  # a blocking call while the others fly
            got, want = issue(k, "all_reduce", "native", 10, False)
            report.check(same(got, want), f"blocking call {k} among asynchronous ones")
    order = np.random.default_rng(rank).permutation(len(pending))  # each rank its own order
    for i in order:
        k, work, want = pending[i]
        report.check(same(work.wait(), want), f"async call {k} ({CALLS[k % len(CALLS)]})")


# Every call of the hot path runs the same steps (restart the persistent request, check the
# rider); what changes from call to call is the sequence number, whose low SEQ_BITS bits (the
# tags') wrap every 2,048 calls: twice round them and some, as 10,000 calls did.
BACK_TO_BACK = 2 * 2**tags.SEQ_BITS + 100


def back_to_back(calls: int = BACK_TO_BACK) -> None:
    x = np.zeros(4, np.int64)
    out = np.empty_like(x)
    wrong = 0
    for i in range(calls):
        x[0], x[1], x[2], x[3] = i, rank, i * rank, 1
        got = comm.all_reduce(x, out=out)
        wrong += not (got[0] == i * n and got[1] == n * (n - 1) // 2
                      and got[2] == i * n * (n - 1) // 2 and got[3] == n)
    report.check(wrong == 0, f"{wrong} of {calls} back-to-back all-reduces wrong")


def dropped_past_a_wrap(calls: int = 2**tags.SEQ_BITS + 52) -> None:
    """Asynchronous ring all-reduces, their handles dropped (results land in ``out=``), with
    the last rank a second behind: more calls in flight than a wrap of the tags' sequence
    bits. The limit on handles not waited on let them all out, and call 0's messages paired
    with call 2048's: other sums on each rank, without a word."""
    outs = [np.zeros(8) for _ in range(calls)]
    if rank == n - 1:
        time.sleep(1.0)
    for i in range(calls):
        comm.all_reduce(np.full(8, float(i) + rank), "sum", "ring", out=outs[i], async_op=True)
    want = [np.full(8, float(n * i + n * (n - 1) // 2)) for i in range(calls)]
    deadline = time.monotonic() + 30  # (the progress thread finishes them: no handle to wait)
    wrong = list(range(calls))
    while wrong and time.monotonic() < deadline:
        wrong = [i for i in wrong if not np.array_equal(outs[i], want[i])]
        time.sleep(0.01)
    comm.barrier()
    report.check(not wrong, f"{len(wrong)} of {calls} dropped calls wrong, from {wrong[:5]}")


def prepared() -> None:
    count = 24
    x = np.empty(count)
    shared = np.empty(count)  # a broadcast runs in place: root's data, everyone's result
    out = {"all_reduce": np.empty(count), "reduce": np.empty(count), "all_gather": np.empty(count * n),
           "reduce_scatter": np.empty((rank + 1) * count // n - rank * count // n)}
    calls = {
        "all_reduce": comm.all_reduce_init(x, "sum", out=out["all_reduce"]),
        "reduce": comm.reduce_init(x, "max", n - 1, out=out["reduce"]),
        "broadcast": comm.broadcast_init(shared, n - 1),
        "all_gather": comm.all_gather_init(x, out=out["all_gather"]),
        "reduce_scatter": comm.reduce_scatter_init(x, "sum", out=out["reduce_scatter"]),
    }
    for k in range(30):
        for name, call in calls.items():
            x[:] = value(k, count, rank)
            shared[:] = value(k, count, rank) if rank == n - 1 else -1.0
            got = call.start().wait()
            if name == "all_reduce":
                want = total(k, count)
            elif name == "reduce":
                want = value(k, count, n - 1) if rank == n - 1 else None
            elif name == "broadcast":
                want = value(k, count, n - 1)
            elif name == "all_gather":
                want = np.concatenate([value(k, count, r) for r in range(n)])
            else:
                want = total(k, count)[rank * count // n:(rank + 1) * count // n]
            report.check(same(got, want), f"prepared {name}, start {k}")
    for name, call in calls.items():  # waited on another thread, the last rank 0.3 s late:
        x[:] = value(31, count, rank)  # start() is refused until that wait() returns (it ran
        shared[:] = value(31, count, rank) if rank == n - 1 else -1.0  # in the running call's
        if rank == n - 1:  # buffers: a persistent request started again while active)
            time.sleep(0.3)
            call.start().wait()
        else:
            call.start()
            waiter = threading.Thread(target=call.wait)
            waiter.start()
            time.sleep(0.1)
            try:
                call.start()
                report.check(n == 1, f"prepared {name}: start() under another thread's wait()")
            except CollectiveError as exc:
                report.check("still in flight" in str(exc), f"prepared {name}: {exc}")
            waiter.join()
    for name, call in calls.items():  # freed under a run: it finishes it (it was dropped:
        x[:] = value(30, count, rank)  # a stale out, or an AttributeError)
        shared[:] = value(30, count, rank) if rank == n - 1 else -1.0
        call.start()
        call.free()
        got = call.wait()
        want = {"all_reduce": total(30, count), "broadcast": value(30, count, n - 1),
                "reduce": value(30, count, n - 1) if rank == n - 1 else None,
                "all_gather": np.concatenate([value(30, count, r) for r in range(n)]),
                "reduce_scatter": total(30, count)[rank * count // n:(rank + 1) * count // n]}
        report.check(same(got, want[name]), f"prepared {name}, freed under its run")
        try:
            call.start()
            report.check(False, f"prepared {name}: start() after free() ran")
        except CollectiveError as exc:
            report.check("after free" in str(exc), f"prepared {name}: {exc}")


def callbacks_call_nothing() -> None:
    """A collective called from a done-callback raises there (it ran beside the program's own
    calls, paired in another order), the hot path's signature too: the callback runs on
    whatever thread finishes the call, here this one at once (a communicator of its own:
    the hot path runs only where nothing earlier is left to report)."""
    comm = mpi.init(timeout=20)
    x = np.ones(4)
    for _ in range(3):
        comm.all_reduce(x)  # (its hot path bound)
    refused = []

    def callback(handle):
        try:
            comm.all_reduce(x)
        except CollectiveError as exc:
            refused.append(str(exc))

    handle = comm.all_reduce(np.full(4, 2.0), async_op=True)
    report.check(same(handle.wait(), np.full(4, 2.0 * n)), "a call before the callback")
    report.check(same(comm.all_reduce(x), np.full(4, float(n))), "the hot path before it")
    handle.add_done_callback(callback)
    report.check(len(refused) == 1 and "from a done-callback" in refused[0],
                 f"a collective from a done-callback: {refused}")
    report.check(same(comm.all_reduce(x), np.full(4, float(n))), "the hot path after it")
    comm.free()


def new_communicators() -> None:
    dup = Communicator(comm.transport.dup(), timeout=30)
    got = dup.all_reduce(np.full(3, rank + 1.0), algorithm="native")
    report.check(np.array_equal(got, np.full(3, n * (n + 1) / 2)), "dup: all_reduce")
    color = rank % 2
    part = comm.transport.split(color, -rank)  # reversed order within each color
    members = [r for r in range(n) if r % 2 == color]
    report.check(part is not None and part.size == len(members), "split: size")
    if part is not None:
        sub = Communicator(part, timeout=30)
        got = sub.all_gather(np.array([rank]), algorithm="auto")
        report.check(np.array_equal(got, sorted(members, reverse=True)), f"split: order {got}")
        got = sub.all_reduce(np.array([rank]), algorithm="ring")
        report.check(int(got[0]) == sum(members), "split: ring all_reduce")
        sub.free()
    none = comm.transport.split(None if rank == 0 else 1, 0)
    report.check((none is None) == (rank == 0), "split: color None gives no transport")
    if none is not None:
        none.free()
    dup.free()


def messages() -> None:
    right, left = (rank + 1) % n, (rank - 1) % n
    for k in range(20):  # a ring of messages, several tags, in flight with a collective
        works = [comm.irecv(np.empty(5 + t), left, tag=t) for t in (k % 3, 7)]
        sends = [comm.isend(np.full(5 + t, rank * 100.0 + k), right, tag=t) for t in (k % 3, 7)]
        total = comm.all_reduce(np.array([k]), algorithm="native")
        report.check(int(total[0]) == k * n, f"messages: collective {k} among them")
        for work, t in zip(works, (k % 3, 7)):
            got = work.wait()
            report.check(np.array_equal(got, np.full(5 + t, left * 100.0 + k)),
                         f"messages: round {k}, tag {t}")
        for send in sends:
            send.wait()
    try:  # nobody sends tag 99: the receive times out, withdrawn, and nothing is broken
        comm.recv(np.empty(3), left, tag=99, timeout=0.2)
        report.check(False, "messages: a receive of nothing returned")
    except Exception as exc:  # noqa: BLE001 - the kind is what is checked
        report.check(type(exc).__name__ == "CollectiveTimeoutError",
                     f"messages: receive of nothing raised {type(exc).__name__}: {exc}")
    meet()
    got = comm.all_reduce(np.ones(2), algorithm="ring")
    report.check(np.array_equal(got, np.full(2, n)), "messages: usable after a receive timed out")


def batches() -> None:
    """The suite's batch bodies over these ranks: each rank's problems, and the same bits."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from suite import bodies, kept_bodies
    from suite.runner import judge

    for body in (bodies.batch_fusion, bodies.buckets_overlap, kept_bodies.kept_buckets):
        problems = judge(WORLD.allgather(body(comm)))
        report.check(not problems, f"{body.__name__}: " + "; ".join(problems[:5]))


def main() -> None:
    batches()
    meet()
    many_in_flight()
    meet()
    back_to_back()
    meet()
    dropped_past_a_wrap()
    meet()
    prepared()
    meet()
    callbacks_call_nothing()
    meet()
    new_communicators()
    meet()
    if n > 1:
        messages()
    comm.free()
    report.finish()


if __name__ == "__main__":
    main()
