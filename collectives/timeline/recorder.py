"""The timeline's recorder: trace events in a bounded buffer, written by a background thread.

Every hook in the library tests ``ON`` (one attribute read) and does nothing else while it
is false. ``start`` turns it on: events go into a ring buffer of at most ``CAPACITY``
events (beyond that, new events are dropped and counted, and the file says how many), and a
writer thread appends them every ``FLUSH_SECONDS`` to this process's file, one event a line,
in the Chrome trace-event JSON array form. That form lets a file lack its closing bracket, so
a process that dies still leaves a file every reader opens (all but its last few
milliseconds).

Events are tuples until the writer formats them: ``(ph, pid, tid, ts, name, cat, args, dur)``
with times in nanoseconds of ``now`` (``time.monotonic_ns``: one clock for every process
of a host). In the file, a *pid* is a participant (a rank, or a device of a multi-device call)
and a *tid* one of its tracks (a communicator, an asynchronous lane, a thread's device calls).
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from .event_lines import format_event

ON = False  # the flag every hook tests
CAPACITY = 1 << 17  # events held at most between two flushes
FLUSH_SECONDS = 0.05
DEVICE_PID = 1000  # device d of a multi-device call is participant DEVICE_PID + d
HOST_PID = 999  # work of a process that is no rank (a single-process batch_reduce)
ENV = "COLLECTIVES_TIMELINE"

now = time.monotonic_ns

_queue: deque = deque()
_names: dict[tuple, list] = {}  # metadata events (names, clocks): every file starts with them
_state = threading.Lock()
_writer: _Writer | None = None
_dropped = 0
_local = threading.local()
_resolvers: list = []  # callables the writer runs before each flush (device timings)


# An event's args (``_args`` formats them): a dict, ``(dict, fragment)``, a wait's ``("for",
# ranks, call, round)`` or a reduction's ``("from", rank, bytes)``; None: none.
Args = dict | tuple[dict, str] | tuple[str, list, int, Any] | tuple[str, int, int] | None


def _put(event: tuple) -> None:
    global _dropped
    if not ON:
        return
    if len(_queue) >= CAPACITY:
        _dropped += 1
        return
    _queue.append(event)


def begin(pid: int, tid: int, name: str, cat: str, ts: int, args: Args = None) -> None:
    _put(("B", pid, tid, ts, name, cat, args, 0))


def end(pid: int, tid: int, ts: int, args: Args = None) -> None:
    _put(("E", pid, tid, ts, None, None, args, 0))


def complete(pid: int, tid: int, name: str, cat: str, ts: int, dur: int,
             args: Args = None) -> None:
    _put(("X", pid, tid, ts, name, cat, args, dur))


def instant(pid: int, tid: int, name: str, cat: str, ts: int, args: Args = None) -> None:
    _put(("i", pid, tid, ts, name, cat, args, 0))


def name_process(pid: int, name: str) -> None:
    """Name participant ``pid`` (once: every file written from now on starts with it)."""
    _name((pid, None), [("M", pid, 0, 0, "process_name", None,
                         {"name": name, "host": socket.gethostname()}, 0),
                        ("M", pid, 0, 0, "process_sort_index", None, {"sort_index": pid}, 0)])


def name_track(pid: int, tid: int, name: str) -> None:
    _name((pid, tid), [("M", pid, tid, 0, "thread_name", None, {"name": name}, 0),
                       ("M", pid, tid, 0, "thread_sort_index", None, {"sort_index": tid}, 0)])


def _name(key: tuple, events: list[tuple], again: bool = False) -> None:
    with _state:
        if key in _names and not again:
            return
        _names[key] = events
    for event in events:
        _put(event)


# Which run a file belongs to: this process's own token, or (``set_run``, at an MPI or NCCL
# ``init``) rank 0's, so that every rank's file of one job says the same; ``merge`` keeps
# a folder's runs apart.
STARTED = time.time()  # (this process's start, wall clock: when its files may begin)
RUN = f"{socket.gethostname()}-{os.getpid()}-{int(STARTED * 1e9)}"


def set_run(run: str) -> None:
    """Files from now on belong to run ``run`` (the job's: rank 0's token)."""
    global RUN
    RUN = run
    _name(("run",), [("M", HOST_PID, 0, 0, "collectives_run", None,
                      {"run": run, "started": STARTED}, 0)], again=True)


def participant(rank: int) -> int:
    """The participant (trace process) of the communicators this thread creates: the rank of
    the first one it created (its world), so a rank's ``dup`` and ``split`` share its row."""
    mine = getattr(_local, "participant", None)
    if mine is None:
        mine = _local.participant = rank
    return mine


def next_index() -> int:
    """The number of the next communicator this thread creates (the same on every rank)."""
    index = getattr(_local, "comms", 0)
    _local.comms = index + 1
    return index


def thread_index() -> int:
    """A small number for the calling thread (its multi-device calls' track)."""
    index = getattr(_local, "index", None)
    if index is None:
        with _state:
            index = _local.index = _next_thread()
    return index


_threads = iter(range(1, 1 << 30))


def _next_thread() -> int:
    return next(_threads)


def set_clock(offset_ns: int, rtt_ns: int, pid: int) -> None:
    """This process's clock runs ``offset_ns`` ahead of rank 0's (measured to ``rtt_ns``)."""
    args = {"offset_us": offset_ns / 1e3, "rtt_us": rtt_ns / 1e3}
    _name(("clock", pid), [("M", pid, 0, 0, "collectives_clock", None, args, 0)], again=True)


def add_resolver(fn) -> None:
    """``fn()`` runs on the writer thread before each flush (it may add events)."""
    if fn not in _resolvers:
        _resolvers.append(fn)


# --- the file (its lines: ``event_lines``) --------------------------------------------------

class _Writer(threading.Thread):
    """Drains the buffer into the file every ``FLUSH_SECONDS`` (and at ``flush``)."""

    def __init__(self, path: Path):
        super().__init__(name="collectives-timeline", daemon=True)
        self.path = path
        self.file: Any = None  # opened at the first event: a process that records nothing
        self.first = True  # leaves no file
        self.wake = threading.Event()
        self.stopping = False
        self.io = threading.Lock()
        self.stopped = False
        with _state:  # names given before this file (later ones come through the buffer)
            self.named = [event for events in _names.values() for event in events]

    def run(self) -> None:
        while not self.stopping:
            self.wake.wait(FLUSH_SECONDS)
            self.wake.clear()
            self.drain()

    def drain(self) -> None:
        global _dropped
        with self.io:
            for resolve in list(_resolvers):
                try:
                    resolve()
                except Exception:  # noqa: BLE001 - a timing lost is no reason to stop writing
                    pass
            lines = []
            while True:
                try:
                    lines.append(format_event(_queue.popleft()))
                except IndexError:
                    break
            if _dropped:
                lost, _dropped = _dropped, 0
                lines.append(format_event(("i", HOST_PID, 0, now(), "timeline dropped events",
                                      "timeline", {"dropped": lost}, 0)))
            self._write(lines)

    def _write(self, lines: list[str]) -> None:
        if not lines or self.stopped:
            return
        if self.file is None:
            self.file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - see close()
            lines = [format_event(event) for event in self.named] + lines
        head = "[\n" if self.first else ",\n"
        self.first = False
        self.file.write(head + ",\n".join(lines))
        self.file.flush()

    def close(self) -> None:
        self.stopping = True
        self.wake.set()
        self.join()
        self.drain()
        with self.io:
            self.stopped = True
            if self.file is not None:
                self.file.write("\n]\n")
                self.file.close()


_files = 0  # files this process has started (a second ``start`` writes a file of its own)


def file_name() -> str:
    """``<host>-<pid>.trace.json``; from this process's second recording on, numbered."""
    extra = f"-{_files + 1}" if _files else ""
    return f"{socket.gethostname()}-{os.getpid()}{extra}.trace.json"


def start(path: str | os.PathLike) -> Path:
    """Record from now on into ``path/<host>-<pid>.trace.json`` (made at the first event);
    returns that file's path."""
    global ON, _writer
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # (a file of that name, a folder that cannot be made)
        why = exc.strerror or exc
        raise ValueError(f"the timeline's folder {str(path)!r} cannot be made ({why}): pass a "
                         "folder the process may write in") from exc
    global _files
    with _state:
        if _writer is not None:
            if _writer.path.parent.resolve() == folder.resolve():
                return _writer.path
            raise RuntimeError(f"the timeline is already being written to {_writer.path}; "
                               "stop() it first")
        target = folder / file_name()  # (a new file: an earlier recording's stays whole)
        _files += 1
    set_run(RUN)  # (every file says its run)
    writer = _Writer(target)
    writer.start()
    with _state:
        _writer = writer
    ON = True
    return target


def stop() -> Path | None:
    """Stop recording; everything recorded so far is written and the file closed."""
    global ON, _writer
    with _state:
        writer, _writer = _writer, None
    if writer is None:
        return None
    ON = False
    writer.close()
    _queue.clear()
    return writer.path


def flush() -> None:
    """Write what has been recorded so far (the writer does so every ``FLUSH_SECONDS``)."""
    writer = _writer
    if writer is not None:
        writer.drain()


def current_file() -> Path | None:
    writer = _writer
    return writer.path if writer is not None else None


atexit.register(stop)
