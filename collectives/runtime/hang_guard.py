"""The hang guard: ends a process whose library call outlived its deadline in the transport.

The engine enforces every call's deadline itself, between two polls of the transport. A poll
that never returns leaves nothing to enforce it: over libfabric, MPICH's ``MPI_Test`` or
``MPI_Improbe`` may stay inside forever once a peer died. No exception can reach a thread inside
a C call, so such a rank would hang, and with it the whole job.

Where the transport says its calls may not return (``Transport.calls_may_not_return``: MPI's
and NCCL's host side, which talks over MPI), one daemon thread per process watches every
engine, and looks every ``PERIOD`` seconds at three things:

* each wait of the engine (``Engine.wait``, a late agreement): still running ``grace`` seconds
  after its own deadline;
* the progress thread of asynchronous calls (``progress_thread.py``), while calls are in
  flight: no new round for longer than the communicator's timeout plus ``grace`` (a round
  never blocks);
* the engine's claim on the communicator (``Engine.busy``, held from a call's entry to its
  return, the hot path's spin included): held by one call (the same ``seq`` and entry count)
  outside any wait for longer than its timeout (the call's or the communicator's, whichever is
  longer: the engine sets no deadline on a call's preparation) plus ``grace``.

Any of them, for ``CONFIRM`` seconds on end, means a thread that has not come back from the
transport in time (the engine's own timeout path, asking peers and telling them, takes well
under a second; a process stopped past its deadline and resumed gets those seconds to raise
its timeout itself). The guard then writes a report to stderr in one write (the call, how
late, every thread's Python stack, the stuck one first where it is known: its innermost frame
shows which transport call never returned), records it on the timeline, and ends the process
with ``os._exit(EXIT_CODE)``. Under ``mpiexec`` the launcher then ends the job's other ranks,
as it does for any rank that dies.

The guard needs the GIL: a transport's C calls that may block must release it (mpi4py's do, and
so does the compiled hot path, ``_hot.c``).

``grace`` is ``max(MIN_GRACE, GRACE_SHARE * timeout)``. ``COLLECTIVES_HANG_GUARD=off`` (or 0)
turns the guard off, ``on`` keeps it as by default; a number there sets ``grace`` in seconds
(``1``: one second, not "on"). ``collectives.backends.mpi.init(
hang_guard=False)`` turns it off for communicators created after it.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from typing import Any

from ..timeline import recorder

ENV = "COLLECTIVES_HANG_GUARD"
EXIT_CODE = 124  # the code ``timeout(1)`` ends a command with
MIN_GRACE = 5.0  # seconds past a deadline before a call counts as stuck, at least...
GRACE_SHARE = 0.1  # ...or this share of its timeout, if longer
CONFIRM = 2.0  # how long a call must stay overdue before the guard acts
PERIOD = 1.0  # how often the guard looks (at most: a short grace makes it look more often)
SHORTEST_PERIOD = 0.01  # (a grace of 1e-9 made it look without pause, holding the GIL)

ENABLED = True  # what the latest mpi.init(hang_guard=...) asked for
_engines: weakref.WeakSet = weakref.WeakSet()
_held: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> (claim, first seen)
_lock = threading.Lock()
_thread: threading.Thread | None = None
_fixed: float | None = None  # the grace COLLECTIVES_HANG_GUARD set, read as engines are watched


def setting() -> float | None:
    """The grace ``COLLECTIVES_HANG_GUARD`` sets (0: off), or None where it sets none."""
    value = os.environ.get(ENV, "").strip().lower()
    if not value:
        return None
    if value in ("off", "no", "false"):
        return 0.0
    if value in ("on", "yes", "true"):  # (the default grace, as unset)
        return None
    try:
        grace = float(value)
    except ValueError:
        grace = -1.0
    if not (grace >= 0 and math.isfinite(grace)):
        raise ValueError(f"{ENV}={value!r} must be 'off' (or 0) or the grace in seconds, a "
                         "positive number")
    return grace


def grace(timeout: float) -> float:
    """How long past a deadline of ``timeout`` seconds a call may still run."""
    return _fixed or max(MIN_GRACE, GRACE_SHARE * timeout)


def period() -> float:
    """How long the guard sleeps between two looks: a quarter of the grace, within
    ``SHORTEST_PERIOD`` and ``PERIOD``."""
    return min(PERIOD, max(SHORTEST_PERIOD, grace(0.0) / 4))


def watch(engine: Any) -> bool:
    """Watch ``engine`` if its transport's calls may not return and the guard is on; whether
    it is watched (a bad ``COLLECTIVES_HANG_GUARD`` raises ``ValueError`` here, as the
    communicator is made)."""
    if not (ENABLED and engine.transport.calls_may_not_return):
        return False
    fixed = setting()
    if fixed == 0.0:
        return False
    global _thread, _fixed
    with _lock:
        _fixed = fixed
        _engines.add(engine)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, daemon=True, name="collectives-hang-guard")
            _thread.start()
    return True


def waiting(engine: Any, deadline: float, timeout: float, op: Any) -> tuple[int, Any]:
    """This thread begins waiting for ``op`` until ``deadline``; what ``done_waiting`` needs
    to restore (the wait this one is inside, if any)."""
    me = threading.get_ident()
    outer = engine.waits.get(me)
    engine.waits[me] = (deadline, timeout, op)
    return me, outer


def done_waiting(engine: Any, watched: tuple[int, Any]) -> None:
    me, outer = watched
    if outer is None:
        engine.waits.pop(me, None)
    else:
        engine.waits[me] = outer


def _run() -> None:
    suspects: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # (the call, first seen)
    while True:
        time.sleep(period())
        _look(suspects)


def _look(suspects: weakref.WeakKeyDictionary) -> None:
    """One pass over the engines watched: a function of its own, so that nothing of a pass
    (its list of engines, the last one looked at) outlives it. Kept in the thread's frame
    through its sleep, they kept freed communicators alive, and each pass's list the ones
    of the pass before (28 engines after 300 dup() and free(), and growing)."""
    now = time.monotonic()
    with _lock:
        engines = list(_engines)
    for engine in engines:
        try:
            stuck = _overdue(engine, now)
            if stuck is None:
                suspects.pop(engine, None)
                continue
            seen = suspects.get(engine)
            if seen is None or seen[0] != stuck[-1]:
                # a process stopped past the deadline (SIGSTOP, a paused machine) and just
                # resumed looks the same: its own wait raises the timeout within CONFIRM
                suspects[engine] = (stuck[-1], now)
            elif now - seen[1] >= CONFIRM:
                _end(engine, *stuck[:-1])
        except Exception:  # noqa: BLE001, S112 - one odd engine must not end the guard
            continue


def _seconds(value: Any, default: float) -> float:
    """``value`` as seconds, where it is a usable timeout; else ``default``."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return seconds if seconds > 0 else default


def _overdue(engine: Any, now: float) -> tuple[str, float, float, int | None, tuple] | None:
    """``(what, timeout, seconds past its deadline, the stuck thread if known, the call's
    identity)`` of a call of ``engine`` that has outlived its deadline by more than the
    grace, or None."""
    waits = list(engine.waits.items())
    for thread, (deadline, timeout, op) in waits:
        if now > deadline + grace(timeout):
            return _describe(op), timeout, now - deadline, thread, (thread, deadline)
    progress = engine.progress_thread
    if progress is not None and engine.inflight:  # asynchronous calls, driven by that thread
        silent = now - engine.beat
        if silent > engine.timeout + grace(engine.timeout):
            return ("the progress thread of its asynchronous calls", engine.timeout,
                    silent - engine.timeout, progress.ident, ("progress", engine.beat))
    if waits or not engine.busy.locked():
        _held.pop(engine, None)
        return None
    claim = (engine.seq, engine.entered)
    seen = _held.get(engine)
    if seen is None or seen[0] != claim:
        _held[engine] = (claim, now)
        return None
    # (outside a wait, the engine sets no deadline: a call's preparation may take a while)
    timeout = max(_seconds(engine.claim_timeout, engine.timeout), engine.timeout)
    held = now - seen[1]
    if held > timeout + grace(timeout):
        return f"call {engine.seq}", timeout, held - timeout, None, claim
    return None


def _describe(op: Any) -> str:
    try:  # (a point-to-point message has no call number of its own)
        return f"call {op.seq}, {op.description}" if op.breaking else op.description
    except Exception:  # noqa: BLE001 - the report must go out whatever went wrong
        return repr(op)


def _end(engine: Any, what: str, timeout: float, late: float, thread: int | None) -> None:
    """Report the stuck call and end this process (never returns)."""
    try:
        name = engine.transport.name
        report = (
            f"collectives: rank {engine.rank} (pid {os.getpid()} on {socket.gethostname()}): "
            f"hang guard: {what} is still running {late:.1f} s past its {timeout:g} s "
            f"deadline: a call into the {name} transport has not returned (each thread's "
            f"Python stack follows, {'the stuck one first' if thread else 'innermost frame last'}"
            "). No exception can reach a thread inside such a call, so this process ends now "
            f"with exit code {EXIT_CODE} instead of hanging; a launcher such as mpiexec then "
            f"ends the other ranks. ({ENV}=off keeps waiting; a number there sets the grace "
            "in seconds.)\n")
        frames = sys._current_frames()
        mine = threading.get_ident()
        order = sorted((t for t in frames if t != mine), key=lambda t: t != thread)
        for ident in order:
            report += (f"Thread {ident:#x}{' (stuck)' if ident == thread else ''} (most recent "
                       "call last):\n" + "".join(traceback.format_stack(frames[ident])))
        # first, in one write: the report stays whole where a launcher merges ranks' output
        data = report.encode(errors="replace")
        while data:
            data = data[os.write(2, data):]
        if recorder.ON:
            recorder.instant(recorder.participant(engine.rank), 0, "hang guard", "failure",
                             recorder.now(), {"call": what, "late_s": round(late, 3)})
            recorder.flush()
    except BaseException:  # noqa: BLE001, S110 - whatever fails here, the process must end
        pass
    finally:
        os._exit(EXIT_CODE)
