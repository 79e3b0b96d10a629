"""A wait interrupted by the program's own exception (Ctrl-C: a KeyboardInterrupt raised by a
signal handler in the main thread) leaves its call in flight and unwaited, as before the
wait: the progress thread still bounds it by its deadline, and a prepared call still refuses
a second ``start()`` while its run is in flight.

Rank 0 runs in the main thread (signals reach no other); rank 1 in a thread of its own.
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
from collectives.backends.local.threads import ThreadTransport
from collectives.backends.local.world import ThreadWorld

from collectives.api.communicator import Communicator
from collectives.errors import CollectiveError

TIMEOUT = 2.0


def _pair() -> list[Communicator]:
    world = ThreadWorld(2, TIMEOUT)
    return [Communicator(ThreadTransport(world, rank), timeout=TIMEOUT, check=True,
                         name="local") for rank in range(2)]


def _interrupt(*_):
    raise KeyboardInterrupt


@pytest.fixture
def ctrl_c_soon():
    """Arms a KeyboardInterrupt in the main thread 0.2 s after the test calls it."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    previous = signal.signal(signal.SIGALRM, _interrupt)
    yield lambda: signal.setitimer(signal.ITIMER_REAL, 0.2)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _issue(comm: Communicator, peer: Communicator, kind: str):
    """One step of ``kind`` in flight, ``peer`` absent from it; what its ``wait()`` is."""
    if kind == "plain":
        return comm.all_reduce(np.ones(4), async_op=True)
    if kind == "batch":
        return comm.batch_all_reduce([np.ones(4), np.ones(1000)], async_op=True)
    like = [np.ones(4), np.ones(3)]  # (the buckets are made on both ranks: a step they take)
    made = threading.Thread(target=peer.buckets, args=(like,), kwargs={"bucket_bytes": 0})
    made.start()
    buckets = comm.buckets(like, bucket_bytes=0)
    made.join()
    buckets.ready(0, np.ones(4))
    buckets.ready(1, np.ones(3))
    return buckets


@pytest.mark.parametrize("kind", ["plain", "batch", "buckets"])
def test_a_handle_whose_wait_was_interrupted_still_times_out(ctrl_c_soon, kind):
    # (its wait marked it waited for before waiting, as did a batch's or the buckets' wait
    # for every call of theirs: the progress thread never timed them out, nor, the oldest
    # call in flight, any later one; a handle only polled, as a done-callback's, never
    # finished)
    comm, absent = _pair()
    first = _issue(comm, absent, kind)  # rank 1 never comes
    ctrl_c_soon()
    with pytest.raises(KeyboardInterrupt):
        first.wait()
    if kind == "buckets":  # (the step is still open, its buckets in flight: a wait() again
        # takes them, and ends with its peer's absence, within its deadline)
        start = time.monotonic()
        with pytest.raises(CollectiveError):
            first.wait()
        assert time.monotonic() - start < 3 * TIMEOUT
        return
    del first
    ended: list[str] = []
    second = comm.all_reduce(np.ones(3), async_op=True)
    second.add_done_callback(lambda work: ended.append(type(work.exception()).__name__))
    start = time.monotonic()
    while not second.is_completed() and time.monotonic() - start < 4 * TIMEOUT:
        time.sleep(0.05)
    assert second.is_completed() and ended == ["CommunicatorBrokenError"], ended
    assert time.monotonic() - start < 3 * TIMEOUT


def test_a_prepared_call_whose_wait_was_interrupted_refuses_a_second_start(ctrl_c_soon):
    # (its wait marked the run waited for before waiting: a start() after the interrupt ran
    # a second run in the first one's buffers; its peer summed the refilled input)
    comm, peer = _pair()
    peer_sums: list[object] = []

    def rank1():
        x, out = np.zeros(4), np.empty(4)
        call = peer.all_reduce_init(x, out=out)
        call.start().wait()
        time.sleep(0.5)  # (late for the run that rank 0's wait is interrupted in)
        x[:] = 1
        try:
            peer_sums.append(float(call.start().wait()[0]))
        except CollectiveError as exc:
            peer_sums.append(type(exc).__name__)

    thread = threading.Thread(target=rank1, daemon=True)
    thread.start()
    x, out = np.zeros(4), np.empty(4)
    call = comm.all_reduce_init(x, out=out)
    call.start().wait()
    x[:] = 10
    call.start()
    ctrl_c_soon()
    with pytest.raises(KeyboardInterrupt):
        call.wait()
    x[:] = 20  # (the program's next step: the run in flight still reads x)
    with pytest.raises(CollectiveError, match=r"start\(\) again before wait\(\)"):
        call.start()
    assert call.wait()[0] in (11.0, 21.0)  # (the run in flight: x as it was when it read it)
    thread.join(4 * TIMEOUT)
    assert peer_sums and peer_sums[0] == float(out[0]), (peer_sums, out)


class _Timeout(float):
    """A timeout whose comparison raises ``failure``: an exception of any type (or Ctrl-C)
    while a call is set up, after its number was taken."""

    failure: BaseException = RuntimeError("set-up failed")

    def __gt__(self, other):
        raise self.failure


@pytest.mark.parametrize("failure", [RuntimeError("set-up failed"), KeyboardInterrupt()],
                         ids=["RuntimeError", "KeyboardInterrupt"])
def test_a_call_that_fails_as_it_is_set_up_tells_its_peers(failure):
    """Only TypeError, ValueError and MemoryError went into the call's agreement: any other
    exception left the call's number taken and the call never issued, and the peer met this
    rank's next call in its place (a mismatch, 0.3 s later). Another exception goes into the
    agreement (the peer: PeerFailedError at once; the communicator usable); Ctrl-C breaks the
    communicator (the ranks are out of step), and the peer hears of it at once."""
    import collectives

    _Timeout.failure = failure

    def body(comm):
        x = np.ones(4)
        start = time.monotonic()
        try:
            comm.all_gather(x, timeout=_Timeout(1.0) if comm.rank == 1 else None)
            first = "returned"
        except BaseException as exc:  # noqa: BLE001 - judged below
            first = type(exc).__name__
        took = time.monotonic() - start
        try:
            after = str(comm.all_reduce(x)[0])
        except CollectiveError as exc:
            after = type(exc).__name__
        return first, took, after

    (first0, took0, after0), (first1, _, after1) = collectives.run(body, 2, timeout=5)
    assert first1 == type(failure).__name__ and first0 == "PeerFailedError", (first0, first1)
    assert took0 < 1.0, took0
    usable = isinstance(failure, Exception)
    assert (after0, after1) == (("2.0", "2.0") if usable else
                                ("CommunicatorBrokenError", "CommunicatorBrokenError"))


def test_a_call_interrupted_while_it_waits_for_room_breaks_the_communicator(ctrl_c_soon):
    # (a transport whose messages carry few bits of a call's number makes a call wait for an
    # old one still in flight: interrupted there, its number was taken and never issued, and
    # the peers' calls paired with this rank's next ones)
    comm, absent = _pair()
    comm.calls.engine.calls_apart = 2  # (as MPI's 2**11, made small)
    handles = [comm.all_reduce(np.ones(4), async_op=True) for _ in range(2)]  # rank 1 never comes
    ctrl_c_soon()
    with pytest.raises(KeyboardInterrupt):
        comm.all_reduce(np.ones(4), async_op=True)  # waits for call 1 first
    start = time.monotonic()
    with pytest.raises(CollectiveError, match="KeyboardInterrupt"):  # (at once: not the old
        comm.all_reduce(np.ones(4))  # calls' timeout, 2 s on)
    assert time.monotonic() - start < TIMEOUT / 2
    del handles
