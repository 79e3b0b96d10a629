"""Asynchronous handles' error paths, prepared calls' misuse, and threads on one communicator
(thread ranks; tests/suite covers the results over every transport)."""

from __future__ import annotations

import gc
import re
import threading
import time
import warnings

import numpy as np
import pytest

import collectives
from collectives import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    CommunicatorBrokenError,
    ConcurrentCallError,
    PeerFailedError,
)


def test_a_timeout_arrives_through_wait_and_breaks_the_communicator():
    def body(comm):
        if comm.rank == 1:
            time.sleep(1.5)  # never joins in time
            return "late"
        handle = comm.all_reduce(np.ones(3), async_op=True)
        assert not handle.is_completed()
        with pytest.raises(CollectiveTimeoutError, match="rank\\(s\\) 1"):
            handle.wait(timeout=0.3)
        assert isinstance(handle.exception(), CollectiveTimeoutError)
        with pytest.raises(CommunicatorBrokenError, match="timed out"):
            comm.all_reduce(np.ones(3))
        return "ok"

    assert collectives.run(body, 2, timeout=10) == ["ok", "late"]


def test_a_mismatch_arrives_through_wait_on_every_rank():
    def body(comm):
        shape = 3 if comm.rank else 4
        handle = comm.all_reduce(np.ones(shape), async_op=True)
        with pytest.raises(CollectiveMismatchError, match="different shape"):
            handle.wait()
        comm.barrier()  # an agreed error leaves the communicator usable
        return float(comm.all_reduce(np.ones(2))[0])

    assert collectives.run(body, 3) == [3.0] * 3


@pytest.mark.parametrize("bad", ["shape", "dtype", "out"])
def test_a_dropped_handles_error_is_logged_and_later_calls_pair_alike(bad, caplog):
    """A handle dropped unwaited whose call failed: its error is logged at a later call,
    which runs (under ``-W error`` a warning would be raised all the same). It was raised
    instead of that call, which was then not issued on that rank alone (each rank learns of
    its own failure at its own time, and a bad ``out`` fails on its rank only): the ranks'
    later calls met calls of other numbers, wrong sums quietly."""
    def body(comm):
        if bad == "out":  # (agreed before: a bad out= then fails on its rank alone)
            comm.all_reduce(np.ones(4))
        x, out = np.ones(4), None
        if comm.rank == 0:
            x = {"shape": np.ones(3 + comm.rank), "dtype": np.ones(4, dtype=object),
                 "out": x}[bad]
            out = np.empty(5) if bad == "out" else None
        handle = comm.all_reduce(x, out=out, async_op=True)
        time.sleep(0.3)  # (it fails meanwhile, on the progress thread where it waits)
        del handle
        gc.collect()
        return [float(comm.all_reduce(np.full(4, 10.0 * k))[0]) for k in (1, 2, 3)]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the log is no warning: nothing raises)
        assert collectives.run(body, 2, timeout=10) == [[20.0, 40.0, 60.0]] * 2
    said = [r.getMessage() for r in caplog.records if r.name == "collectives.calls"]
    assert any(re.match(r"rank 0: call \d failed, and its handle was dropped without "
                        r"wait\(\)", line) for line in said), said


def test_a_handle_failed_as_it_was_issued_is_released_once_dropped(caplog):
    # (the error kept its frames, the issuing call's among them, which held the handle: the
    # engine, keeping the error, kept the handle and its inputs for good, and counted it
    # against the limit on handles unwaited)
    def body(comm):
        comm.all_reduce(np.ones(4))
        out = np.empty(5) if comm.rank == 0 else None
        for _ in range(3):
            handle = comm.all_reduce(np.ones(4), out=out, async_op=True)
            time.sleep(0.05)
            del handle
        return comm.calls.engine.outstanding

    assert collectives.run(body, 2, timeout=10) == [0, 0]
    assert any("dropped without wait" in r.getMessage() for r in caplog.records)


def test_a_failing_peer_reaches_handles_in_flight():
    def body(comm):
        if comm.rank == 0:
            raise RuntimeError("boom")
        handle = comm.all_reduce(np.ones(3), async_op=True)
        with pytest.raises(PeerFailedError, match="rank 0 failed.*boom"):
            handle.wait(timeout=10)
        return "told"

    with pytest.raises(RuntimeError, match="boom"):
        collectives.run(body, 3)


def test_a_raising_done_callback_is_logged_and_spoils_no_other_handle(caplog):
    """Rank 1 never comes: the timeout of the first of three calls in flight breaks the
    communicator, and the second's callback raises while the break is spread. The first still
    raises its own timeout, the others their abandonment at once (the raise used to stop the
    spreading: the third waited its whole timeout), and the callback's error is logged."""
    def body(comm):
        if comm.rank == 1:
            time.sleep(2.0)
            return None
        handles = [comm.all_reduce(np.ones(4) * k, async_op=True) for k in range(3)]
        handles[1].add_done_callback(lambda work: 1 / 0)
        batch = comm.batch_all_reduce([np.ones(2)], async_op=True)
        batch.add_done_callback(lambda work: 1 / 0)
        with pytest.raises(CollectiveTimeoutError):
            handles[0].wait(timeout=0.3)
        start = time.monotonic()
        for later in (handles[2], handles[1], batch):
            with pytest.raises(CommunicatorBrokenError, match="timed out"):
                later.wait()
        return time.monotonic() - start

    with caplog.at_level("ERROR", logger="collectives.calls"):
        waited, _ = collectives.run(body, 2, timeout=10)
    assert waited < 1.0
    assert sum("done-callback" in r.getMessage() for r in caplog.records) == 2


def test_a_second_thread_is_refused_and_never_gets_a_wrong_result():
    results, refused = [], []

    def body(comm):
        barrier = threading.Barrier(2)

        def hammer(offset):
            barrier.wait()
            for k in range(200):
                try:
                    got = comm.all_reduce(np.full(4, float(comm.rank + offset + k)))
                except ConcurrentCallError:
                    refused.append(1)
                    continue
                except CollectiveMismatchError:
                    continue  # ranks paired calls of different threads: caught, never wrong
                except Exception:  # noqa: BLE001 - a peer's failure after a refusal
                    return
                results.append((got, k, offset, comm.rank))

        threads = [threading.Thread(target=hammer, args=(o,)) for o in (0, 1000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    try:
        collectives.run(body, 2, timeout=5)
    except Exception:  # noqa: BLE001 - the run may end in a timeout once calls are refused
        pass
    assert refused, "a second thread's call was never refused"
    for got, _, _, _ in results:  # whatever completed holds a sum of one call per rank
        assert got.min() == got.max()


def test_prepared_calls_are_started_and_waited_in_turn():
    def body(comm):
        x, out = np.ones(3), np.empty(3)
        prepared = comm.all_reduce_init(x, out=out)
        with pytest.raises(collectives.CollectiveError, match="wait\\(\\) before start"):
            prepared.wait()
        prepared.start()
        with pytest.raises(collectives.CollectiveError, match="start\\(\\) again before wait"):
            prepared.start()
        return prepared.wait().tolist()

    assert collectives.run(body, 2) == [[2.0] * 3] * 2
    buf = np.ones(4)
    with pytest.raises(ValueError, match="out overlaps x; pass x itself"):
        collectives.run(lambda c: c.all_reduce_init(buf[:3], out=buf[1:]), 1)
    # (an all-gather's x cannot be its out: "pass x itself" asked for what cannot be)
    with pytest.raises(ValueError, match="out overlaps x; pass a separate array"):
        collectives.run(lambda c: (lambda b: c.all_gather_init(b[:2], out=b))(np.ones(4)), 2)
    with pytest.raises(TypeError, match="out is required"):
        collectives.run(lambda c: c.all_reduce_init(np.ones(3), out=None), 1)


def test_a_prepared_call_freed_under_a_run_still_gives_its_result_and_starts_no_more():
    # (on MPI the run was dropped: a stale out on one rank, MEAN divided twice, or an
    # AttributeError for the other collectives; tests/mpi_scenarios/async_calls.py runs that
    # case for every prepared collective, and this one the same promise on thread ranks)
    def body(comm):
        x, out = np.full(3, comm.rank + 1.0), np.empty(3)
        got = []
        for op in ("sum", "mean"):
            prepared = comm.all_reduce_init(x, op, out=out)
            for k in (1, 2):  # (the first run waited for, the second freed under its run)
                x[:] = k * (comm.rank + 1.0)
                if k == 2 and comm.rank == 0:
                    time.sleep(0.2)  # (its peers free() before rank 0 has started the run)
                prepared.start()
                if k == 2:
                    prepared.free()
                    assert prepared.is_completed()  # (free() ran it to its end)
                got.append(prepared.wait().tolist())
            with pytest.raises(collectives.CollectiveError, match="start\\(\\) after free"):
                prepared.start()
        return got

    for got in collectives.run(body, 3):
        assert got == [[6.0] * 3, [12.0] * 3, [2.0] * 3, [4.0] * 3], got


def test_a_prepared_call_freed_under_a_failing_run_raises_its_error():
    # (free() waited for the run and kept its error where no wait() would ever ask for it)
    def body(comm):
        x = np.ones(3 if comm.rank == 0 else 4)
        prepared = comm.all_reduce_init(x, out=np.empty_like(x))
        prepared.start()
        with pytest.raises(collectives.CollectiveMismatchError):
            prepared.free()
        with pytest.raises(collectives.CollectiveMismatchError):  # (and wait() says it too)
            prepared.wait()
        return comm.all_reduce(np.ones(2)).tolist()  # (refused at its agreement: usable)

    assert collectives.run(body, 2) == [[2.0, 2.0]] * 2


def test_a_breaking_rank_loses_its_peers_only_the_calls_it_abandons():
    """Rank 0 has a receive posted early (never matched) and then times out in a collective:
    its peers lose that collective, not the point-to-point message rank 1 sends rank 2 (a
    message's number is the call count when it was posted, not a call it takes part in)."""
    def body(comm):
        if comm.rank == 0:
            comm.irecv(np.zeros(3), 1, tag=7)  # never matched
        sent = comm.isend(np.arange(3.0), 2, tag=9) if comm.rank == 1 else None
        for _ in range(3):
            comm.all_reduce(np.ones(2))
        if comm.rank == 0:
            with pytest.raises(CollectiveTimeoutError, match="call 4"):
                comm.all_reduce(np.ones(2), timeout=0.5)
            return "timed out"
        time.sleep(1.5)  # (after rank 0 broke)
        if comm.rank == 1:
            sent.wait(2)
            return "sent"
        got = np.zeros(3)
        comm.recv(got, 1, tag=9, timeout=1)
        return got.tolist()

    assert collectives.run(body, 3, timeout=5) == ["timed out", "sent", [0.0, 1.0, 2.0]]


def test_free_from_a_second_thread_is_refused_while_a_call_runs():
    # (free() waited for the call, freed the communicator under it, and the peer waited out
    # its timeout in the next call)
    def body(comm):
        outcome = []

        def other():
            time.sleep(0.3)
            try:
                comm.free()
                outcome.append("freed")
            except ConcurrentCallError:
                outcome.append("refused")

        if comm.rank == 1:
            thread = threading.Thread(target=other)
            thread.start()
        else:
            time.sleep(1.0)  # rank 1's call waits for this rank meanwhile
        total = comm.all_reduce(np.ones(4), timeout=5)
        if comm.rank == 1:
            thread.join()
        again = comm.all_reduce(np.ones(4), timeout=5)  # still usable on both ranks
        return outcome, float(total[0]), float(again[0])

    assert collectives.run(body, 2, timeout=10) == [([], 2.0, 2.0), (["refused"], 2.0, 2.0)]


def test_a_batch_past_its_deadline_still_returns_what_finished():
    # (the calls left past the deadline were waited with timeout=0.0, which wait() refuses)
    def body(comm):
        xs = [np.full(1000, 1.0, np.float32) for _ in range(20)]
        handle = comm.batch_all_reduce(xs, bucket_bytes=4000, async_op=True, timeout=5)
        while not handle.is_completed():
            time.sleep(0.01)
        return float(handle.wait(timeout=1e-6)[0][0])

    assert collectives.run(body, 2, timeout=10) == [2.0, 2.0]


@pytest.mark.parametrize("timeout", [-1, 1e-6])
def test_a_buckets_wait_with_a_bad_or_short_timeout_keeps_its_step(timeout):
    def body(comm):
        xs = [np.full(1000, 1.0, np.float32) for _ in range(20)]
        buckets = comm.buckets(xs, bucket_bytes=4000, timeout=5)
        for k, x in enumerate(xs):
            buckets.ready(k, x)
        while not all(h.is_completed() for h in buckets.pending if hasattr(h, "is_completed")):
            time.sleep(0.01)
        try:
            first = float(buckets.wait(timeout=timeout)[0][0])
        except ValueError as exc:
            assert "timeout" in str(exc)
            first = float(buckets.wait()[0][0])  # the step is still there
        return first

    assert collectives.run(body, 2, timeout=10) == [2.0, 2.0]


@pytest.mark.parametrize("timeout", [-1, float("nan"), "soon", True,
                                     pytest.param(10 ** 400, id="10**400")])
def test_every_wait_checks_its_timeout(timeout):
    done = collectives.all_reduce([np.ones(3), np.ones(3)], "sum", async_op=True)
    with pytest.raises((TypeError, ValueError), match="timeout"):
        done.wait(timeout=timeout)
    assert done.wait()[0].tolist() == [2.0, 2.0, 2.0]  # (a refused wait breaks nothing)

    def body(comm):
        handle = comm.all_reduce(np.ones(3), async_op=True)
        with pytest.raises((TypeError, ValueError), match="timeout"):
            handle.wait(timeout=timeout)
        return handle.wait().tolist()

    assert collectives.run(body, 2, timeout=10) == [[2.0] * 3] * 2


@pytest.mark.parametrize("kind", ["batch", "buckets", "plain", "prepared"])
def test_a_numpy_float_timeout_counts_as_seconds_on_a_host_up_for_years(kind, monkeypatch):
    """A wait's deadline is ``time.monotonic()`` (seconds since boot) plus the timeout: a NumPy
    float32 timeout made the sum a float32, rounded to 8 s at three years up, so a batch's
    wait(np.float32(2.0)) beside a peer 0.3 s late timed out at once (float16: ``inf`` after
    18 hours, then nan). Every wait counts in Python floats."""
    boot = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: boot() + 1e8)  # (up three years)

    def body(comm):
        x = np.ones(4)
        prepared = comm.all_reduce_init(x, out=np.empty(4))
        for timeout in (np.float32(2.0), np.float16(2.0)):
            if comm.rank == 1:
                time.sleep(0.3)
            if kind == "batch":
                got = comm.batch_all_reduce([x, x], async_op=True).wait(timeout)[1]
            elif kind == "buckets":
                buckets = comm.buckets([x, x])
                buckets.ready(0, x)
                buckets.ready(1, x)
                got = buckets.wait(timeout)[1]
            elif kind == "plain":
                got = comm.all_reduce(x, async_op=True).wait(timeout)
            else:
                got = prepared.start().wait(timeout)
            assert got.tolist() == [2.0] * 4
        return True

    assert collectives.run(body, 2, timeout=10) == [True, True]


def test_finished_result_is_a_done_callbacks_view_of_the_result():
    # (what a transport's handle reads in its done-callback: the result, without marking the
    # handle waited for; refused while the call still runs)
    def body(comm):
        seen = []
        if comm.rank == 1:
            time.sleep(0.2)  # (rank 0's call is still running when it asks)
        handle = comm.all_reduce(np.full(3, comm.rank + 1.0), async_op=True)
        if comm.rank == 0:
            with pytest.raises(RuntimeError, match="still running"):
                handle.finished_result()
        handle.add_done_callback(lambda work: seen.append(work.finished_result()))
        result = handle.wait()
        return seen[0].tolist(), result.tolist(), comm.calls.engine.outstanding

    for seen, result, outstanding in collectives.run(body, 2):
        assert seen == result == [3.0, 3.0, 3.0] and outstanding == 0
