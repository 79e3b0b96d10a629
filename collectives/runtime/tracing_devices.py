"""The old home of the multi-device timeline hooks, kept for the modules that import it here.

The hooks live in ``collectives.timeline.record_devices`` (the timeline is one package:
``collectives.timeline``); import them from there.
"""

from __future__ import annotations

from ..timeline.record_devices import device_backend, device_call, device_pids, marked

__all__ = ["device_backend", "device_call", "device_pids", "marked"]
