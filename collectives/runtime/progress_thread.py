"""The progress thread: drives a communicator's asynchronous calls while nobody waits.

An asynchronous call that did not finish at once is left in the engine's ``inflight`` list;
this daemon thread (one per communicator, started by the first such call) advances them, in
call order, and hears peers' failure notices, so a call completes while its caller computes.
It never spins (a user thread may be computing beside it): between rounds it idles through the
transport, which also answers peers' questions. The oldest call in flight, when nobody waits for
it, times out here once it has been the oldest for its timeout, as a waited one would in
``Engine.wait`` (a handle's callbacks, see ``Work.add_done_callback``, then hear of it): a
long queue of calls moving along is not a stuck one. Once nothing is in flight for
``THREAD_LINGER`` seconds (or the communicator is freed) it ends; a loop of
``start()``/``wait()`` reuses it meanwhile.
"""

from __future__ import annotations

import threading
import time
from typing import Any

THREAD_LINGER = 0.1  # how long the progress thread waits for new asynchronous calls
# after this long a wait also looks for peers' notices and agreements: the engine's waits
# (``engine.SLOW_WAIT`` is this) and this thread's rounds alike
SLOW_WAIT = 2e-3


def start(engine: Any) -> None:
    """Make sure ``engine``'s progress thread runs (``engine.progress_thread``)."""
    with engine.state:  # (a lingering thread decides under this lock whether to end)
        thread = engine.progress_thread
        if thread is not None and thread.is_alive():
            return
        thread = threading.Thread(target=_drive, args=(engine,), daemon=True,
                                  name=f"collectives-progress-{engine.rank}")
        engine.driven_by(thread)
        thread.start()


def _drive(engine: Any) -> None:
    start_time = time.monotonic()
    idle_since = None
    # the oldest call in flight (its number: the call itself would keep its result alive
    # while this thread idles), and since when it is
    oldest: list = [None, 0.0]
    transport = engine.transport
    while True:
        engine.heartbeat()  # (a round that never ends: the hang guard looks)
        with engine.state:  # (freed: only the sends a rank left posted remain, which their
            if not engine.inflight or engine.freed:  # receivers take: nothing to drive)
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > THREAD_LINGER:
                    engine.driven_by(None)
                    return
            else:
                idle_since = None
        try:
            engine.progress()
            _expire(engine, oldest)
            if time.monotonic() - start_time > SLOW_WAIT:
                failure = transport.poll_failure()
                if failure is not None:
                    engine.peer_failed(failure)
        except BaseException:  # noqa: BLE001 - errors reach the operations' waiters
            pass
        # the idle answers peers' questions and may fail: the calls in flight need this thread
        try:
            transport.idle(max(time.monotonic() - start_time, SLOW_WAIT))
        except BaseException:  # noqa: BLE001 - as above
            time.sleep(SLOW_WAIT)


def _expire(engine: Any, seen: list) -> None:
    """Time out the oldest call in flight once it has been the oldest for its timeout, unless a
    ``wait()`` watches it (a wait applies its own deadline; the calls after it wait behind
    it). ``seen``: ``[that call's number, since when]``, kept between rounds."""
    op = next((op for op in list(engine.inflight) if op.breaking and not op.finished), None)
    now = time.monotonic()
    seq = None if op is None else op.seq
    if seq != seen[0]:
        seen[0], seen[1] = seq, now
        return
    timeout = engine.timeout if op is None or op.timeout is None else op.timeout
    if op is not None and not op.waited_by and now - seen[1] > timeout:
        engine.time_out(op, timeout)
