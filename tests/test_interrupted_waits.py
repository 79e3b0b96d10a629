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


def _issue(comm: Communicator, kind: str):
    """One step of ``kind`` in flight; what its ``wait()`` is."""
    if kind == "plain":
        return comm.all_reduce(np.ones(4), async_op=True)
    if kind == "batch":
        return comm.batch_all_reduce([np.ones(4), np.ones(1000)], async_op=True)
    buckets = comm.buckets([np.ones(4), np.ones(3)], bucket_bytes=0)
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
    first = _issue(comm, kind)  # rank 1 never comes
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
