"""How the NCCL transport's stream hands over to and from its callers' streams.

Every call of a communicator is enqueued on the transport's own stream. At a call's start
that stream waits for the caller's current stream (``follow``: an event recorded there, the
inputs' producers); a blocking call's end makes the caller's current stream wait for an event
after the call (``hand_back``), so results are ready for the caller's next work. An
asynchronous call leaves the caller's stream free: while it is issued (``issuing`` ..
``issued``) its end records the handle's event instead, and the handle's ``wait()`` makes the
current stream of the result's library wait for it (``lead_library``). The caller's stream is
CuPy's current one, or another library's given by its raw handle (PyTorch's, through its
array kind's ``stream_handle``), wrapped once per handle as a ``cupy.cuda.ExternalStream``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from collectives.backends.cupy.placement import DeviceAndStream

from collectives.foreign import kind_of
from collectives.runtime.validate import check_timeout

from .hot_path import with_pointers


class StreamOrder:
    """The stream hand-over of ``NcclTransport`` (a base class of it)."""

    device: int
    stream: Any
    arrays: Any
    watchdog: Any
    timeout: float
    engine: Any  # a weak reference to the engine (set by it)

    def call_limit(self) -> float:
        """The seconds the watchdog gives the work being enqueued now: its call's own
        ``timeout=`` (the operation the engine advances, ``Engine.advancing``: an
        asynchronous call's work may be enqueued while another call is made; else the hot
        path's call, ``claim_timeout``), or the communicator's where it gave none. The
        communicator's alone left a call's ``timeout=5`` to fail at 300 s, where a peer
        never came to work the call had enqueued."""
        engine = self.engine() if self.engine is not None else None
        if engine is None:
            return self.timeout
        op = engine.advancing
        try:
            limit = check_timeout(op.timeout if op is not None else engine.claim_timeout)
        except (TypeError, ValueError):  # (a bad one: the call raises saying so)
            return self.timeout
        return self.timeout if limit is None else limit

    def init_streams(self) -> None:
        self.followed: int | None = None  # the call whose input made this stream wait
        self.following = threading.local()  # each thread's event for follow_caller
        self.spare: deque = deque()  # events the watchdog saw complete, for record() again
        self.external: dict[int, Any] = {}  # other libraries' streams, by raw handle
        # an asynchronous call being issued (``issuing``): its end leaves the caller's stream
        # free, and its event goes to the call's handle
        self.issue: Issue | None = None

    def keep_until_done(self, description: str, event: Any, keep: list) -> None:
        raise NotImplementedError  # (the transport's: it knows the call's number)

    def on_stream(self):
        """Context for CuPy calls that enqueue on the current stream: this device, its
        stream."""
        import cupy

        return DeviceAndStream(cupy.cuda.Device(self.device), self.stream)

    def record(self):
        """An event recorded on this stream now (see ``record_here``)."""
        import cupy

        with cupy.cuda.Device(self.device):
            return self.record_here()

    def record_here(self):
        """``record`` with this device already current: an event the watchdog saw complete
        (``spare``), else a new one (creating and destroying one per call costs
        microseconds)."""
        try:
            event = self.spare.pop()
        except IndexError:
            import cupy

            event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(self.stream)
        return event

    def caller_stream(self, handle: int | None = None) -> Any:
        """The stream the caller's work is ordered by, with this device current: CuPy's
        current stream, or another library's current stream given as its raw
        ``cudaStream_t`` (``handle``; PyTorch's, say), wrapped once per handle."""
        import cupy

        if handle is None:
            return cupy.cuda.get_current_stream()
        stream = self.external.get(handle)
        if stream is None:  # (0: the legacy default stream, CuPy's own null stream)
            stream = cupy.cuda.Stream.null if handle == 0 else cupy.cuda.ExternalStream(
                handle, self.device)
            self.external[handle] = stream
        return stream

    def follow_caller(self, seq: int | None = None) -> None:
        """This stream waits for the calling thread's current stream on this device (the
        producers of a call's inputs). ``seq``: the call the caller is in, as its input is
        adapted; a call's start then need not wait again."""
        import cupy

        with cupy.cuda.Device(self.device):
            self.follow(cupy.cuda.get_current_stream(), seq)

    def follow(self, caller: Any, seq: int | None = None) -> None:
        """``follow_caller`` for the stream ``caller``, with this device current."""
        self.followed = seq
        if caller.ptr != self.stream.ptr:
            # one event per thread, recorded again at every call: a wait takes the event's
            # state when it is enqueued, so a later record cannot change it
            event = getattr(self.following, "event", None)
            if event is None:
                import cupy

                event = self.following.event = cupy.cuda.Event(block=False,
                                                                disable_timing=True)
            event.record(caller)
            self.stream.wait_event(event)

    def lead_caller(self, event: Any = None) -> None:
        """The calling thread's current stream waits for this one (a blocking call's end),
        through ``event`` where one was just recorded on it; nothing while an asynchronous
        call is issued (its handle orders the caller's stream at ``wait()``)."""
        import cupy

        if self.issue is not None:
            return
        with cupy.cuda.Device(self.device):  # (the legacy stream, handle 0, is the current
            caller = cupy.cuda.get_current_stream()  # device's: this one must be current)
            if caller.ptr != self.stream.ptr:
                caller.wait_event(event if event is not None else self.record_here())

    def hand_back(self, description: str, seq: int, caller: Any = None) -> None:
        """A blocking call's end in one event: the watchdog watches it (as ``watch``), and
        the caller's stream waits for it (as ``lead_caller``; ``caller``: that stream, with
        this device current, as the hot path gives it). While an asynchronous call is issued
        (``issuing``) the caller's stream does not wait: the event is the handle's (never
        recycled), and the watchdog keeps the call's arrays alive until it is done."""
        issue = self.issue
        if issue is not None:
            event = self.record() if caller is None else self.record_here()
            issue.event = event
            self.watchdog.watch(description, seq, event, self.call_limit(), issue.keep)
            return
        if caller is None:
            event = self.record()
            self.lead_caller(event)
        else:
            event = self.record_here()
            if caller.ptr != self.stream.ptr:
                caller.wait_event(event)
        self.watchdog.watch(description, seq, event, self.call_limit())

    def issuing(self, keep: list) -> Issue:
        """Start issuing an asynchronous call whose arrays are ``keep`` (see ``Issue``); end
        it with ``issued``."""
        self.issue = Issue(keep)
        return self.issue

    def issued(self, describe: Callable[[], str]) -> Any:
        """End the issue ``issuing`` started: the event after the call's work (recorded now
        where no hot call recorded one, and watched with the call's arrays, under the
        description ``describe()`` gives)."""
        issue, self.issue = self.issue, None
        assert issue is not None
        if issue.event is None:
            issue.event = self.record()
            self.keep_until_done(describe(), issue.event, issue.keep)
        return issue.event

    def lead_library(self, event: Any, result: Any) -> None:
        """The current stream of ``result``'s library on this device waits for ``event``
        (a handle's ``wait()``): another library's, where its array kind gives its current
        stream (``DevicePointers.stream_handle``: PyTorch's); else CuPy's."""
        import cupy

        first = result[0] if isinstance(result, (list, tuple)) and result else result
        handle = None
        if first is not None and not self.arrays.owns(first):
            kind = kind_of(first)
            pointers = with_pointers(kind.kind) if kind is not None else None
            if pointers is not None:
                handle = pointers.stream_handle(self.device)
        with cupy.cuda.Device(self.device):
            caller = self.caller_stream(handle)
            if caller.ptr != self.stream.ptr:
                caller.wait_event(event)

    def current_stream_handle(self) -> int:
        """The raw handle of CuPy's current stream on this device."""
        import cupy

        with cupy.cuda.Device(self.device):
            return cupy.cuda.get_current_stream().ptr


class Issue:
    """An asynchronous call being issued: the arrays it reads and writes (``keep``: held
    until its work is done) and the event after that work (``event``: None until
    recorded)."""

    __slots__ = ("event", "keep")

    def __init__(self, keep: list):
        self.keep, self.event = keep, None
