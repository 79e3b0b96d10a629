"""Handles of multi-device calls made with ``async_op=True``.

The call itself has already been enqueued on every device's stream (nothing in a call waits
on the host); the handle records one event per GPU after it, and ``wait()`` waits on the host
until every one has passed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from collectives.errors import CollectiveTimeoutError
from collectives.runtime.validate import check_timeout

POLL_SECONDS = 50e-6


class DeviceWork:
    """The result of a multi-device call, ready once ``wait()`` returns."""

    def __init__(self, result: Any, devices: Iterable[int], description: str):
        import cupy

        self._result = result
        self.description = description
        self._events = []
        for device in sorted(set(devices)):
            with cupy.cuda.Device(device):
                event = cupy.cuda.Event(block=False, disable_timing=True)
                event.record()
            self._events.append(event)

    def is_completed(self) -> bool:
        """Whether every device has finished the call (never waits)."""
        return all(e.done for e in self._events)

    def wait(self, timeout: float | None = None) -> Any:
        """The call's result, once every device's stream has finished it.

        With ``timeout`` (seconds), raise ``CollectiveTimeoutError`` if the
        devices have not finished by then (the work stays enqueued).
        """
        timeout = check_timeout(timeout)
        if timeout is None:
            for e in self._events:
                e.synchronize()
            return self._result
        deadline = time.monotonic() + float(timeout)
        while not self.is_completed():
            if time.monotonic() >= deadline:
                raise CollectiveTimeoutError(self.description, [], float(timeout), None,
                                             detail="the GPUs had not finished the enqueued work")
            time.sleep(POLL_SECONDS)
        return self._result

    def exception(self) -> BaseException | None:
        """Always None: errors of a multi-device call are raised by the call itself."""
        return None

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "in flight"
        return f"<DeviceWork {self.description}: {state}>"
