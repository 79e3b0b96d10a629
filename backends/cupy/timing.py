"""Device time on the timeline: CUDA events around each round of a multi-device call.

While the timeline records, a call of the CuPy multi-device backend records a timing event on
each device's stream where the call first enqueues work there (its *anchor*, taken with the
host's clock) and at the end of every round. Nothing waits for them: the timeline's writer
thread reads them once they have completed (``Event.done``) and puts each device's rounds
on a row of their own, ``GPU k (device work)``, as the device ran them: the elapsed time
between two events is the GPU's own measure. Where the stream was still busy with earlier
work when the call began, the anchor's host time is early by that much (every round of the
call shifts with it; durations are exact).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from collectives.timeline import recorder as rec

GPU_ROWS = rec.DEVICE_PID + 500  # GPU k's device work is participant GPU_ROWS + k
PENDING: deque = deque(maxlen=1024)  # calls whose events may not have completed yet
_lock = threading.Lock()


def _cupy():
    import cupy

    return cupy


class DeviceCall:
    """One call's events: an anchor per device, then one per device at each round's end."""

    __slots__ = ("anchors", "marks", "stream_of")

    def __init__(self, stream_of: Any):
        self.stream_of = stream_of
        self.anchors: dict[int, tuple[Any, int]] = {}  # device -> (event, host time)
        self.marks: list[tuple[int, dict]] = []  # (round, {device: event})

    def first(self, device: int) -> None:
        """Work for ``device`` is about to be enqueued: anchor it, if not yet anchored."""
        if device not in self.anchors:
            self.anchors[device] = (self._event(device), rec.now())

    def mark(self, index: int) -> None:
        self.marks.append((index, {d: self._event(d) for d in self.anchors}))

    def end(self) -> None:
        if self.marks:
            with _lock:
                PENDING.append(self)
            rec.add_resolver(resolve)

    def _event(self, device: int) -> Any:
        cp = _cupy()
        with cp.cuda.Device(device):
            event = cp.cuda.Event()  # timing enabled
            event.record(self.stream_of(device))
        return event


def resolve() -> None:
    """(On the writer thread.) Turn the completed calls' events into device spans."""
    cp = _cupy()
    elapsed = getattr(cp.cuda, "get_elapsed_time", None)
    while True:
        with _lock:
            if not PENDING:
                return
            call = PENDING[0]
            last = call.marks[-1][1]
            if not all(event.done for event in last.values()):
                return  # the next flush looks again
            PENDING.popleft()
        if elapsed is None:  # a CuPy without event timing measures nothing
            continue
        for device, (anchor, host) in call.anchors.items():
            pid = GPU_ROWS + device
            rec.name_process(pid, f"GPU {device} (device work)")
            rec.name_track(pid, 0, "stream")
            before = 0.0
            for index, events in call.marks:
                event = events.get(device)
                if event is None:
                    continue
                with cp.cuda.Device(device):
                    ms = float(elapsed(anchor, event))
                start, end = host + int(before * 1e6), host + int(ms * 1e6)
                rec.complete(pid, 0, f"round {index}", "device", start, max(end - start, 0),
                             {"round": index})
                before = ms
