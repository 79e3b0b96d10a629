"""Asynchronous handles used from several threads: a collective called from a done-callback
(which runs on whatever thread finishes a call), batches refused on other threads while one
thread's call holds the communicator, and a prepared call waited for on another thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import collectives
from collectives import ConcurrentCallError


def test_a_collective_called_from_a_done_callback_is_refused():
    """A done-callback runs on whatever thread finishes the call: one that called the
    communicator ran beside the program's own calls and paired with its peers' calls in
    another order (30 expected, 110 given, quietly). It raises ConcurrentCallError there,
    and the program's calls are right."""
    def body(comm):
        seen = []

        def callback(handle):
            try:
                seen.append(comm.all_reduce(np.full(3, 10.0 * (comm.rank + 1))).tolist())
            except ConcurrentCallError as exc:
                seen.append(str(exc))

        handle = comm.all_reduce(np.ones(3), async_op=True)
        handle.add_done_callback(callback)
        total = comm.all_reduce(np.full(3, 100.0), timeout=5).tolist()
        handle.wait()
        handle.add_done_callback(callback)  # (finished: it runs at once, here, refused alike)
        return total, seen

    for total, seen in collectives.run(body, 2, timeout=10):
        assert total == [200.0] * 3
        assert len(seen) == 2 and all("from a done-callback" in s for s in seen), seen


def test_batches_refused_on_other_threads_leave_nothing_behind():
    """Two threads' batches, refused (ConcurrentCallError) while a third thread's call holds
    the communicator: each batch's tag was the communicator's, not the thread's, so two that
    overlapped left one behind, and every later plain call on that rank carried it (a
    mismatch on every rank, which broke the communicator)."""
    def body(comm):
        if comm.rank == 0:
            stop, refused = threading.Event(), []

            def racer(k):
                xs = [np.ones(10, np.float32) for _ in range(3 + k)]
                while not stop.is_set():
                    try:
                        comm.batch_all_reduce(xs, bucket_bytes=0)
                    except ConcurrentCallError:
                        refused.append(k)

            holder = threading.Thread(target=comm.all_reduce, args=(np.ones(3),),
                                      kwargs={"timeout": 10})
            holder.start()
            time.sleep(0.2)  # (inside its call, waiting for rank 1)
            racers = [threading.Thread(target=racer, args=(k,)) for k in range(2)]
            for t in racers:
                t.start()
            time.sleep(1.0)
            stop.set()
            for t in racers + [holder]:
                t.join()
            assert refused  # (the calls after show what a tag left behind would do)
        else:
            time.sleep(1.5)
            comm.all_reduce(np.ones(3), timeout=10)
        return comm.all_reduce(np.ones(4), timeout=5).tolist()

    assert collectives.run(body, 2, timeout=10) == [[2.0] * 4] * 2


def test_a_prepared_call_waited_on_another_thread_is_not_started_again_until_it_returns():
    """(``wait()`` marked the run waited for as it began: a second thread's ``start()`` then
    ran in the running call's buffers; on MPI its persistent request started again while
    active, and a rank that did nothing wrong got 5 where 3 was right)"""
    def body(comm):
        x, out = np.full(3, comm.rank + 1.0), np.empty(3)
        prepared = comm.all_reduce_init(x, out=out)
        prepared.start().wait()
        if comm.rank == 1:
            time.sleep(0.5)  # (rank 0's run stays in flight meanwhile)
            return [prepared.start().wait().tolist() for _ in range(2)]
        prepared.start()
        waiter = threading.Thread(target=prepared.wait, kwargs={"timeout": 5})
        waiter.start()
        time.sleep(0.2)  # (the waiter is inside wait())
        with pytest.raises(collectives.CollectiveError, match="still in flight"):
            prepared.start()
        waiter.join()
        first = out.tolist()
        return [first, prepared.start().wait().tolist()]

    assert collectives.run(body, 2, timeout=10) == [[[3.0] * 3] * 2] * 2
