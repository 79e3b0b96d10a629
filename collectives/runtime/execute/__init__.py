"""Executors: run schedules over a backend, in either way of calling.

* multi-device (one controller holds every participant's buffer), two strategies chosen by
  the backend: ``.tiles`` (every round on one cache-sized tile at a time: one pass over
  memory, right for CPUs) and ``.rounds`` (each round over whole ranges, with
  begin/end-of-round hooks: right for GPUs and for transports that group calls per round);
* SPMD (``.spmd``): one rank's plan over point-to-point messages, as a resumable state
  machine, so a blocking call and an asynchronous one are the same object; it reads the
  input where it lies (``.first_touch``).
"""

from __future__ import annotations

from .devices import DeviceBackend, run_multi_device
from .spmd import PointToPoint, Request, SpmdRun

__all__ = ["DeviceBackend", "PointToPoint", "Request", "SpmdRun", "run_multi_device"]
