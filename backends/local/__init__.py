"""The embedded transport: NumPy arrays in one process, nothing to install.

* Multi-device (``.devices``): the "devices" are logical CPU devices sharing this process's
  memory; schedules run tile by tile on a small pool of worker threads (or round by round).
* SPMD (``.threads``): ranks are threads of this process. ``collectives.run(fn, size)``
  calls ``fn(comm)`` on every rank; ``init()`` gives a one-rank communicator.
"""

from __future__ import annotations

from .devices import NumpyDevices, devices
from .threads import ThreadTransport, init, run
from .world import ThreadWorld

__all__ = ["NumpyDevices", "ThreadTransport", "ThreadWorld", "devices", "init", "run"]
