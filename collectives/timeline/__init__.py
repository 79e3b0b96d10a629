"""A timeline of every call on every rank, as Chrome trace events (Perfetto, chrome://tracing).

``COLLECTIVES_TIMELINE=PATH`` in the environment, or ``start`` at run time, records every
collective and point-to-point message of every communicator in this process: the call with
its signature, its agreement, each round of its plan (sends and receives with peer and bytes,
the reductions), its waits and whom they waited for; asynchronous calls from issue to
completion on lanes of their own; the fast path as one span; multi-device calls round by
round on each device. Each process writes ``PATH/<host>-<pid>.trace.json``;
``collectives timeline merge PATH -o trace.json`` joins them with the clocks lined up
(``align``, run by ``collectives.init``), and ``collectives timeline plot`` and ``summary``
read the result. See docs/timeline.md.

Off, it costs one attribute test per hook; on, a bounded buffer and a writer thread.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import recorder
from .clock import align
from .recorder import ENV, current_file, flush, stop

__all__ = ["ENV", "align", "current_file", "enabled", "flush", "start", "stop"]


def start(path: str | os.PathLike | None = None) -> Path:
    """Record every call from now on into the folder ``path`` (default: the environment's
    ``COLLECTIVES_TIMELINE``, else ``./timeline``); returns this process's file there."""
    return recorder.start(path or os.environ.get(ENV) or "timeline")


def enabled() -> bool:
    """Whether calls are being recorded."""
    return recorder.ON


if os.environ.get(ENV):
    try:
        start(os.environ[ENV])
    except ValueError as _exc:  # (a bad folder must not stop ``import collectives``: said once)
        import warnings

        warnings.warn(f"{ENV}: {_exc}; not recording a timeline", RuntimeWarning, stacklevel=2)
